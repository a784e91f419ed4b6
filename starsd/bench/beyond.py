"""Batched drafting (capacity), fair scheduling (fairness), adaptive gamma (gamma).

Each measures the new behaviour against the plain one in the same run, against a real ``starsd draft``
process on loopback, with emulated targets (:mod:`starsd.bench.emulated`: the product's target engine and
draft link) in this process.

* capacity: requests/s at saturation of the real draft checkpoint, ``--max-batch 1`` against ``--max-batch B``.
  Saturation: many sessions, zero verify time, each re-requesting as soon as it is answered.
* fairness: skewed demand (one target with many sessions, a few with one each) on an emulated draft, in the
  fully-loaded regime, ``--schedule fifo`` against ``fair``: per-target throughput and Jain's index of it.
* gamma: per profile, fixed gamma against adaptive gamma (``starsd.adaptive.choose_gamma`` per session per
  round, fed with what the target measures), on an emulated draft that charges time per drafted token.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from starsd.bench.emulated import EmulatedTarget, RoundDraws, TargetRun, TargetSpec
from starsd.bench.harness import (
    DraftEndpoint,
    draft_info,
    local_draft,
    run_window,
    window_counts,
)
from starsd.bench.report import Column, Machine, table
from starsd.proto import starsd_pb2 as pb

# --- pure parts --------------------------------------------------------------------------------------------


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all equal, 1/n when one takes all."""
    if not values:
        raise ValueError("Jain's index needs at least one value")
    if any(v < 0 for v in values):
        raise ValueError("Jain's index is for non-negative values")
    squares = sum(v * v for v in values)
    if squares == 0.0:
        return 1.0  # nobody got anything: equally
    return sum(values) ** 2 / (len(values) * squares)


def per_target_throughput(runs: Sequence[TargetRun], start: float, end: float) -> dict[str, float]:
    """Committed tokens/s per target id (several runs may share one id: one per session)."""
    if end <= start:
        raise ValueError("the window must have a positive length")
    out: dict[str, float] = {}
    for run in runs:
        _, tokens = window_counts([run], start, end)
        out[run.target_id] = out.get(run.target_id, 0.0) + tokens / (end - start)
    return out


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


# --- 1. capacity ---------------------------------------------------------------------------------------------

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
    info = await draft_info(endpoint.address)
    spec = TargetSpec(
        gamma=gamma,
        betas=(0.7,) * gamma,
        verify_seconds=0.0,
        wire_seconds=0.0,
        vocab_size=int(info.vocab_size),
        session_tokens=session_tokens,
    )
    w = await run_window(
        lambda i: EmulatedTarget(f"t{i}", endpoint.address, info, spec, seed=i), sessions, warmup, duration, endpoint
    )
    assert w.before is not None and w.after is not None
    start, end = w.before, w.after
    d = {k: v - start.samples[k] for k, v in end.samples.items() if k in start.samples}
    wall = end.wall - start.wall
    draft_cpu = end.draft_cpu - start.draft_cpu if end.draft_cpu is not None and start.draft_cpu is not None else None
    rounds, tokens = window_counts(w.runs, w.t0, w.t1)
    services = [r.service for run in w.runs for r in run.rounds if w.t0 <= r.committed < w.t1]
    span = w.t1 - w.t0
    return CapacityPoint(
        batch,
        sessions,
        gamma,
        rounds,
        span,
        rounds / span,
        tokens / span,
        statistics.median(services) * 1e3 if services else 0.0,
        ratio(d.get("starsd_draft_batch_size_sum", 0.0), d.get("starsd_draft_batch_size_count", 0.0)),
        ratio(d.get("starsd_draft_busy_seconds_total", 0.0), wall),
        ratio(draft_cpu, wall) if draft_cpu is not None else None,
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
        endpoints = {
            b: await drafts.enter_async_context(
                local_draft(["--model", draft_model, "--max-batch", str(b), "--max-sessions", str(4 * sessions + 64)])
            )
            for b in dict.fromkeys(batches)
        }
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
    batches = list(dict.fromkeys(p.max_batch for p in points))
    medians = {b: statistics.median(p.requests_per_s for p in points if p.max_batch == b) for b in batches}
    out = []
    for b in batches:
        mine = [p for p in points if p.max_batch == b]
        out.append(
            CapacitySummary(
                b,
                medians[b],
                min(p.requests_per_s for p in mine),
                max(p.requests_per_s for p in mine),
                ratio(medians[b], medians[batches[0]]),
                [p.speedup for p in mine],
            )
        )
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


# --- 2. fairness ---------------------------------------------------------------------------------------------


@dataclass
class FairnessPoint:
    schedule: str
    per_target: dict[str, float]  # committed tokens/s
    total: float
    jain: float


def skewed_targets(busy_sessions: int, small_targets: int) -> list[str]:
    """The target id of each session: ``busy`` ``busy_sessions`` times, then ``small-1..small_targets``."""
    return ["busy"] * busy_sessions + [f"small-{i + 1}" for i in range(small_targets)]


def fairness_point(schedule: str, per_target: dict[str, float]) -> FairnessPoint:
    values = list(per_target.values())
    return FairnessPoint(schedule, dict(per_target), sum(values), jain_index(values))


async def measure_fairness(
    schedules: Sequence[str],
    busy_sessions: int,
    small_targets: int,
    tq: float,
    tp: float,
    gamma: int,
    alpha: float,
    warmup: float,
    duration: float,
) -> list[FairnessPoint]:
    ids = skewed_targets(busy_sessions, small_targets)
    points: list[FairnessPoint] = []
    for schedule in schedules:
        extra = ["--emulate-service-time", repr(tq), "--schedule", schedule, "--max-sessions", "256"]
        async with local_draft(extra) as endpoint:
            info = await draft_info(endpoint.address)
            spec = TargetSpec(gamma, (alpha,) * gamma, tp, 0.0, int(info.vocab_size))
            # A target with several sessions is emulated as that many one-session targets under its id.
            make = functools.partial(_skewed_target, ids, endpoint.address, info, spec)
            w = await run_window(make, len(ids), warmup, duration)
        points.append(fairness_point(schedule, per_target_throughput(w.runs, w.t0, w.t1)))
    return points


def _skewed_target(ids: list[str], address: str, info: pb.InfoResponse, spec: TargetSpec, i: int) -> EmulatedTarget:
    return EmulatedTarget(ids[i], address, info, spec, seed=i)


def _target_throughput(target_id: str, point: FairnessPoint) -> float:
    return point.per_target.get(target_id, 0.0)


@dataclass(frozen=True)
class FairnessConfig:
    busy_sessions: int
    small_targets: int
    tq: float
    tp: float
    gamma: int
    alpha: float
    duration: float


@dataclass
class FairnessReport:
    """``starsd bench fairness``'s report: per schedule, committed tokens/s per target and Jain's index."""

    benchmark: str = field(default="fairness", init=False)
    config: FairnessConfig
    machine: Machine
    points: list[FairnessPoint]

    def table(self) -> str:
        ids = list(self.points[0].per_target) if self.points else []
        columns: list[Column[FairnessPoint]] = [Column("schedule", lambda p: p.schedule, "", 9, left=True)]
        columns += [Column(i, functools.partial(_target_throughput, i), ".1f", 10) for i in ids]
        columns += [Column("total", lambda p: p.total, ".1f", 10), Column("Jain", lambda p: p.jain, ".3f", 7)]
        lines = table(self.points, columns)
        lines.append("(committed tokens/s per target; Jain's index over targets, not sessions)")
        return "\n".join(lines)


# --- 3. adaptive gamma -----------------------------------------------------------------------------------------


GammaPolicy = int | str  # a fixed gamma, or "adaptive"


@dataclass
class GammaPoint:
    profile: str
    n: int
    policy: str  # "1".."8" or "adaptive"
    tokens_per_s: float
    mean_gamma: float


@dataclass
class GammaSummary:
    profile: str
    n: int
    best_fixed: str
    best_fixed_tokens_per_s: float
    gamma4_tokens_per_s: float | None
    adaptive_tokens_per_s: float
    adaptive_vs_best: float | None  # adaptive / best fixed
    adaptive_vs_gamma4: float | None


def summarise_gamma(points: Sequence[GammaPoint]) -> list[GammaSummary]:
    """Per (profile, N): the best fixed gamma, gamma=4 and adaptive, with their ratios."""
    out: list[GammaSummary] = []
    keys = list(dict.fromkeys((p.profile, p.n) for p in points))
    for profile, n in keys:
        group = [p for p in points if p.profile == profile and p.n == n]
        fixed = [p for p in group if p.policy != "adaptive"]
        adaptive = [p for p in group if p.policy == "adaptive"]
        if not fixed or not adaptive:
            continue
        best = max(fixed, key=lambda p: p.tokens_per_s)
        g4 = next((p.tokens_per_s for p in fixed if p.policy == "4"), None)
        a = adaptive[0].tokens_per_s
        out.append(
            GammaSummary(
                profile,
                n,
                best.policy,
                best.tokens_per_s,
                g4,
                a,
                ratio(a, best.tokens_per_s),
                ratio(a, g4) if g4 is not None else None,
            )
        )
    return out


async def measure_gamma(
    profile_names: Sequence[str],
    gammas: Sequence[int],
    n_multipliers: Sequence[int],
    warmup: float,
    duration: float,
    max_gamma: int = 8,
    progress: Callable[[str], None] | None = None,
) -> list[GammaPoint]:
    from starsd import model
    from starsd.bench import profiles

    points: list[GammaPoint] = []
    for name in profile_names:
        prof = profiles.get(name)
        token_time = prof.tq / prof.gamma  # Tq is gamma sequential draft steps
        n_star = max(1, round(model.optimal_targets(prof.tq, prof.tp, prof.tc)))
        extra = [
            "--emulate-service-time",
            "0",
            "--emulate-token-time",
            repr(token_time),
            "--max-gamma",
            str(max(16, max_gamma)),
            "--max-sessions",
            "1024",
        ]

        async with local_draft(extra) as endpoint:
            info = await draft_info(endpoint.address)
            for mult in n_multipliers:
                n = n_star * mult
                policies: list[GammaPolicy] = [*gammas, "adaptive"]
                for policy in policies:
                    gamma = max_gamma if policy == "adaptive" else int(policy)
                    spec = TargetSpec(
                        gamma=gamma,
                        betas=(prof.alpha,) * gamma,
                        verify_seconds=prof.tp,
                        wire_seconds=prof.tc,
                        vocab_size=int(info.vocab_size),
                        adaptive=policy == "adaptive",
                    )

                    width = max(max_gamma, *gammas)
                    make = functools.partial(_gamma_target, endpoint.address, info, spec, prof.alpha, width)
                    w = await run_window(make, n, warmup, duration)
                    _, tokens = window_counts(w.runs, w.t0, w.t1)
                    used = [g for run in w.runs for g in run.gammas]
                    point = GammaPoint(
                        prof.name, n, str(policy), tokens / (w.t1 - w.t0), statistics.fmean(used) if used else 0.0
                    )
                    points.append(point)
                    if progress:
                        progress(f"  {prof.name} N={n} gamma={policy}: {point.tokens_per_s:.1f} tokens/s")
    return points


def _gamma_target(
    address: str, info: pb.InfoResponse, spec: TargetSpec, alpha: float, width: int, i: int
) -> EmulatedTarget:
    """Target ``i``: its acceptance draws are the same under every gamma policy (:class:`RoundDraws`)."""
    return EmulatedTarget(f"t{i}", address, info, spec, seed=i, accept=RoundDraws((alpha,) * width, seed=i))


# A row of the gamma table: (profile, N), each policy's point, and the summary of that (profile, N).
_GammaRow = tuple[tuple[str, int], dict[str, GammaPoint], GammaSummary | None]


@dataclass
class GammaReport:
    """``starsd bench gamma``'s report: tokens/s per (profile, N, policy), and adaptive against the fixed."""

    benchmark: str = field(default="gamma", init=False)
    machine: Machine
    points: list[GammaPoint]
    summary: list[GammaSummary]

    def table(self) -> str:
        """One row per (profile, N): every policy's tokens/s, adaptive's mean gamma and its ratios."""
        policies = list(dict.fromkeys(p.policy for p in self.points))
        summaries = {(s.profile, s.n): s for s in self.summary}
        rows = [
            (key, {p.policy: p for p in self.points if (p.profile, p.n) == key}, summaries.get(key))
            for key in dict.fromkeys((p.profile, p.n) for p in self.points)
        ]

        def tokens(q: str) -> Callable[[_GammaRow], float | None]:
            return lambda r: r[1][q].tokens_per_s if q in r[1] else None

        columns: list[Column[_GammaRow]] = [
            Column("profile", lambda r: r[0][0], "", 36, left=True),
            Column("N", lambda r: r[0][1], "d", 4),
        ]
        columns += [Column("adapt" if q == "adaptive" else f"g={q}", tokens(q), ".1f", 8) for q in policies]
        columns += [
            Column("mean g", lambda r: r[1]["adaptive"].mean_gamma if "adaptive" in r[1] else 0.0, ".2f", 8),
            Column("a/best", lambda r: r[2].adaptive_vs_best if r[2] else None, ".3f", 8),
            Column("a/g4", lambda r: r[2].adaptive_vs_gamma4 if r[2] else None, ".3f", 7),
        ]
        lines = table(rows, columns)
        lines.append("(committed tokens/s, all targets together; mean g: adaptive's mean gamma)")
        return "\n".join(lines)
