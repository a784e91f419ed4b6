"""Draft server capacity: requests/s at saturation of the real draft checkpoint, ``--max-batch 1`` against
``--max-batch B``, in one run.

A real ``starsd draft`` process on loopback serves emulated targets (:mod:`starsd.bench.emulated`: the product's
target engine and draft link) in this process. Saturation: many sessions, zero verify time, each re-requesting
as soon as it is answered.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from starsd.bench.emulated import EmulatedTarget, TargetSpec
from starsd.bench.harness import DraftEndpoint, local_draft, run_window, window_counts
from starsd.bench.report import Column, Machine, ratio, table

TARGETS_NICENESS = 10  # added to this process's niceness once the drafts run (see measure_capacity)


@dataclass
class CapacityPoint:
    max_batch: int
    sessions: int
    gamma: int
    rounds: int
    duration: float
    requests_per_s: float
    tokens_per_s: float
    service_p50_ms: float  # the draft's reported time per request (its batch's time / batch size)
    mean_batch: float | None = None  # requests per drafting step in the window, from /metrics
    draft_busy: float | None = None  # fraction of the window the draft's compute thread was computing
    draft_cpu: float | None = None  # CPU cores the draft used (its server and model processes)
    speedup: float | None = None  # against the first (smallest) batch in the same repeat
    repeat: int = 0  # which pass over the batch sizes (they are interleaved: 1, 8, 1, 8, ...)


@dataclass
class CapacitySummary:
    max_batch: int
    requests_per_s: float  # median over the repeats
    requests_per_s_min: float
    requests_per_s_max: float
    speedup: float | None  # median requests/s over the first batch size's median
    speedups: list[float | None]  # per repeat, against the first batch size in that repeat


async def _capacity_window(
    endpoint: DraftEndpoint,
    batch: int,
    sessions: int,
    gamma: int,
    warmup: float,
    duration: float,
    session_tokens: int,
) -> CapacityPoint:
    spec = TargetSpec(gamma, (0.7,) * gamma, 0.0, 0.0, int(endpoint.info.vocab_size), session_tokens=session_tokens)
    w = await run_window(
        lambda i: EmulatedTarget(f"t{i}", endpoint.address, endpoint.info, spec, seed=i),
        sessions,
        warmup,
        duration,
        endpoint,
    )
    assert w.change is not None
    d, span = w.change, w.t1 - w.t0
    rounds, tokens = window_counts(w.runs, w.t0, w.t1)
    services = [r.service for run in w.runs for r in run.rounds if w.t0 <= r.committed < w.t1]
    return CapacityPoint(
        batch,
        sessions,
        gamma,
        rounds,
        span,
        rounds / span,
        tokens / span,
        statistics.median(services) * 1e3 if services else 0.0,
        ratio(d.samples.get("starsd_draft_batch_size_sum", 0.0), d.samples.get("starsd_draft_batch_size_count", 0.0)),
        ratio(d.samples.get("starsd_draft_busy_seconds_total", 0.0), d.wall),
        ratio(d.draft_cpu, d.wall) if d.draft_cpu is not None else None,
    )


async def measure_capacity(
    draft_model: str,
    batches: Sequence[int],
    sessions: int,
    gamma: int,
    warmup: float,
    duration: float,
    session_tokens: int = 512,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[CapacityPoint]:
    """One draft per batch size, all started first; then ``repeats`` interleaved passes over them.

    Interleaving (1, 8, 1, 8, ...) puts every batch size under the same slow drifts of a shared machine, and
    each pass gives its own speedup; the summary takes medians.
    """
    points: list[CapacityPoint] = []
    async with contextlib.AsyncExitStack() as drafts:
        args = ["--max-sessions", str(4 * sessions + 64), "--max-batch"]
        starting = {b: local_draft(Path(draft_model), args=[*args, str(b)]) for b in dict.fromkeys(batches)}
        endpoints = {b: await drafts.enter_async_context(draft) for b, draft in starting.items()}
        # The draft's capacity is what is measured: its targets stand for other machines, so this process (the
        # emulated targets, started after the drafts) yields the CPU to the drafts it shares this machine with.
        os.nice(TARGETS_NICENESS)
        for repeat in range(repeats):
            first: CapacityPoint | None = None
            for b, endpoint in endpoints.items():
                point = await _capacity_window(endpoint, b, sessions, gamma, warmup, duration, session_tokens)
                point.repeat = repeat
                first = first or point
                point.speedup = ratio(point.requests_per_s, first.requests_per_s)
                points.append(point)
                if progress:
                    progress(f"  pass {repeat + 1}/{repeats} max-batch {b}: {point.requests_per_s:.1f} requests/s")
    return points


def summarise_capacity(points: Sequence[CapacityPoint]) -> list[CapacitySummary]:
    """Per batch size, in order: the median over the passes, the range, and the speedup over the first size."""
    passes = {b: [p for p in points if p.max_batch == b] for b in dict.fromkeys(p.max_batch for p in points)}
    medians = {b: statistics.median(p.requests_per_s for p in mine) for b, mine in passes.items()}
    base = next(iter(medians.values()), 0.0)
    out = []
    for b, mine in passes.items():
        rates, speedups = [p.requests_per_s for p in mine], [p.speedup for p in mine]
        out.append(CapacitySummary(b, medians[b], min(rates), max(rates), ratio(medians[b], base), speedups))
    return out


CAPACITY_COLUMNS: list[Column[CapacityPoint]] = [
    Column("pass", lambda p: p.repeat + 1, "d", 4),
    Column("max-batch", lambda p: p.max_batch, "d", 10),
    Column("sessions", lambda p: p.sessions, "d", 9),
    Column("gamma", lambda p: p.gamma, "d", 6),
    Column("requests/s", lambda p: p.requests_per_s, ".1f", 12),
    Column("tokens/s", lambda p: p.tokens_per_s, ".1f", 10),
    Column("ms/req", lambda p: p.service_p50_ms, ".2f", 8),
    Column("batch", lambda p: p.mean_batch, ".2f", 7),
    Column("busy", lambda p: p.draft_busy, ".2f", 6),
    Column("cpu", lambda p: p.draft_cpu, ".2f", 6),
    Column("x first", lambda p: p.speedup, ".2f", 9),
]


@dataclass
class CapacityReport:
    """``starsd bench capacity``'s report: every window, and the medians over the passes."""

    benchmark: str = field(default="capacity", init=False)
    draft_model: str
    session_tokens: int
    repeats: int
    machine: Machine
    summary: list[CapacitySummary]
    points: list[CapacityPoint]

    def table(self) -> str:
        lines = table(self.points, CAPACITY_COLUMNS)
        lines.append(
            "(ms/req: the draft's median compute per request; batch: mean requests per step; busy: compute-thread "
            "busy fraction; cpu: cores the draft used, server and model process; x first: against the first batch "
            "size in the same pass)"
        )
        for s in self.summary:
            speedup = f"{s.speedup:.2f}" if s.speedup is not None else "-"
            lines.append(
                f"max-batch {s.max_batch}: median {s.requests_per_s:.1f} requests/s "
                f"(range {s.requests_per_s_min:.1f}-{s.requests_per_s_max:.1f}), x{speedup} the first"
            )
        return "\n".join(lines)
