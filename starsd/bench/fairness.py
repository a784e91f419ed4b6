"""Fair scheduling of the draft: skewed demand (one target with many sessions, a few with one each) on an
emulated draft in the fully-loaded regime, ``--schedule fifo`` against ``fair``: per-target throughput and
Jain's index of it.

A real ``starsd draft`` process on loopback serves emulated targets (:mod:`starsd.bench.emulated`) in this process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from starsd.bench.emulated import EmulatedTarget, TargetRun, TargetSpec
from starsd.bench.harness import local_draft, run_window, window_counts
from starsd.bench.report import Column, Machine, table
from starsd.proto import starsd_pb2 as pb


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


@dataclass(frozen=True)
class FairnessConfig:
    busy_sessions: int  # sessions of the busy target
    small_targets: int  # targets with one session each
    tq: float  # emulated draft service time
    tp: float  # emulated verify time
    gamma: int
    alpha: float
    duration: float  # measured seconds per schedule
    warmup: float


async def measure_fairness(schedules: Sequence[str], cfg: FairnessConfig) -> list[FairnessPoint]:
    ids = skewed_targets(cfg.busy_sessions, cfg.small_targets)
    points: list[FairnessPoint] = []
    for schedule in schedules:
        async with local_draft(emulate=cfg.tq, args=["--schedule", schedule, "--max-sessions", "256"]) as endpoint:
            spec = TargetSpec(cfg.gamma, (cfg.alpha,) * cfg.gamma, cfg.tp, 0.0, int(endpoint.info.vocab_size))
            # A target with several sessions is emulated as that many one-session targets under its id.
            make = functools.partial(_skewed_target, ids, endpoint.address, endpoint.info, spec)
            w = await run_window(make, len(ids), cfg.warmup, cfg.duration)
        points.append(fairness_point(schedule, per_target_throughput(w.runs, w.t0, w.t1)))
    return points


def _skewed_target(ids: list[str], address: str, info: pb.InfoResponse, spec: TargetSpec, i: int) -> EmulatedTarget:
    return EmulatedTarget(ids[i], address, info, spec, seed=i)


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

        def tokens_of(target_id: str) -> Callable[[FairnessPoint], float]:
            return lambda p: p.per_target.get(target_id, 0.0)

        columns += [Column(i, tokens_of(i), ".1f", 10) for i in ids]
        columns += [Column("total", lambda p: p.total, ".1f", 10), Column("Jain", lambda p: p.jain, ".3f", 7)]
        lines = table(self.points, columns)
        lines.append("(committed tokens/s per target; Jain's index over targets, not sessions)")
        return "\n".join(lines)
