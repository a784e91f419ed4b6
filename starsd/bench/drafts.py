"""``starsd bench star --drafts D,...``: a star of stars, D emulated drafts and D x N* emulated targets.

The same harness as the star benchmark (:mod:`starsd.bench.harness`): real draft servers with an emulated
service time, each in its own process, and emulated targets (the product's target engine and draft link) in this
process. Each target connects to its first choice among the drafts, :func:`starsd.assignment.ordered_drafts`,
so each draft carries N* targets. The figure: total throughput at D drafts against D times the one-draft figure
at N* (docs/architecture.md section 2: D drafts keep D x N* targets busy), goal at least 0.9.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from starsd.assignment import ordered_drafts
from starsd.bench.emulated import EmulatedTarget, TargetSpec
from starsd.bench.harness import DraftEndpoint, local_draft, run_window, window_counts
from starsd.bench.report import Column, ratio, table
from starsd.bench.star import StarConfig

GOAL = 0.9


@dataclass(frozen=True)
class DraftsPoint:
    drafts: int
    targets: int
    throughput: float  # tokens/s, every target together
    per_draft: list[int]  # targets connected to each draft (their first choice)
    ratio: float | None  # throughput / (drafts x the one-draft throughput at N*)
    errors: list[str]


@dataclass(frozen=True)
class DraftsReport:
    profile: str
    optimal_targets: int  # N* of one draft
    draft_service_time: float
    duration: float
    warmup: float
    one_draft_throughput: float
    goal: float
    goal_met: bool  # every point's ratio >= goal
    points: list[DraftsPoint]

    def table(self) -> str:
        cols: list[Column[DraftsPoint]] = [
            Column("D", lambda p: p.drafts, "d", 3),
            Column("targets", lambda p: p.targets, "d", 8),
            Column("per draft", lambda p: "/".join(map(str, p.per_draft)), "", 12),
            Column("tok/s", lambda p: p.throughput, ".1f", 9),
            Column("/(D x one)", lambda p: p.ratio, ".3f", 11),
        ]
        lines = [
            f"profile {self.profile}: N* = {self.optimal_targets}, Tq = {self.draft_service_time * 1e3:.3f} ms; "
            f"{self.duration:.1f} s measured per point after {self.warmup:.1f} s",
            *table(self.points, cols, sep=" "),
            f"one draft at N*: {self.one_draft_throughput:.1f} tok/s; goal: D drafts make >= {self.goal:g} x D "
            f"times that: {'yes' if self.goal_met else 'NO'}",
        ]
        return "\n".join(lines)


def assign(target_ids: Sequence[str], addresses: Sequence[str]) -> list[str]:
    """Each target's draft: its first choice (the target side's list parsing, with failover, is the product's)."""
    return [ordered_drafts(t, addresses)[0] for t in target_ids]


async def measure(
    cfg: StarConfig, endpoints: Sequence[DraftEndpoint], spec: TargetSpec, drafts: int, n_star: int
) -> tuple[float, list[int], list[str]]:
    """Throughput of ``drafts`` drafts (the first of ``endpoints``) and ``drafts * n_star`` targets."""
    by_address = {e.address: e for e in endpoints[:drafts]}
    ids = [f"bench-d{drafts}-t{i}" for i in range(drafts * n_star)]
    chosen = assign(ids, list(by_address))

    def make(i: int) -> EmulatedTarget:
        return EmulatedTarget(ids[i], chosen[i], by_address[chosen[i]].info, spec, cfg.target_seed(drafts, i))

    w = await run_window(make, len(ids), cfg.warmup, cfg.duration, None, strict=False)
    _, tokens = window_counts(w.runs, w.t0, w.t1)
    return tokens / (w.t1 - w.t0), [chosen.count(a) for a in by_address], w.errors


async def run_drafts(cfg: StarConfig, draft_counts: Sequence[int], extra: list[str]) -> DraftsReport:
    """Start max(D) emulated drafts, then measure one draft at N* and every D at D x N*."""
    n_star = cfg.model_inputs().optimal_targets()
    async with contextlib.AsyncExitStack() as stack:
        drafts = [local_draft(emulate=cfg.draft_service_time, args=extra) for _ in range(max(draft_counts))]
        endpoints = [await stack.enter_async_context(d) for d in drafts]
        spec = cfg.target_spec(int(endpoints[0].info.vocab_size))
        results = {d: await measure(cfg, endpoints, spec, d, n_star) for d in sorted({1, *draft_counts})}
    one = results[1][0]
    points = [
        DraftsPoint(d, d * n_star, tput, per, ratio(tput, d * one), errors)
        for d, (tput, per, errors) in sorted(results.items())
        if d in draft_counts
    ]
    return DraftsReport(
        profile=cfg.profile.name,
        optimal_targets=n_star,
        draft_service_time=cfg.draft_service_time or cfg.profile.tq,
        duration=cfg.duration,
        warmup=cfg.warmup,
        one_draft_throughput=one,
        goal=GOAL,
        goal_met=all(pt.ratio is not None and pt.ratio >= GOAL for pt in points),
        points=points,
    )
