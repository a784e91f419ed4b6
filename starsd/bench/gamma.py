"""Adaptive gamma: per profile, fixed gamma against adaptive gamma (``starsd.adaptive.choose_gamma`` per session
per round, fed with what the target measures), on an emulated draft that charges time per drafted token.

A real ``starsd draft`` process on loopback serves emulated targets (:mod:`starsd.bench.emulated`) in this process.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from starsd import system_model
from starsd.bench.emulated import EmulatedTarget, RoundDraws, TargetSpec
from starsd.bench.harness import local_draft, run_window, window_counts
from starsd.bench.report import Column, Machine, ratio, table
from starsd.proto import starsd_pb2 as pb


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
        vs_g4 = ratio(a, g4) if g4 is not None else None
        out.append(GammaSummary(profile, n, best.policy, best.tokens_per_s, g4, a, ratio(a, best.tokens_per_s), vs_g4))
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
    from starsd.bench import profiles

    points: list[GammaPoint] = []
    for name in profile_names:
        prof = profiles.get(name)
        token_time = prof.tq / prof.gamma  # Tq is gamma sequential draft steps
        n_star = max(1, round(system_model.optimal_targets(prof.tq, prof.tp, prof.tc)))
        extra = ["--emulate-token-time", repr(token_time), "--max-sessions", "1024"]
        extra += ["--max-gamma", str(max(16, max_gamma))]
        async with local_draft(emulate=0.0, args=extra) as endpoint:
            for n in (n_star * mult for mult in n_multipliers):
                for policy in [*map(str, gammas), "adaptive"]:
                    gamma = max_gamma if policy == "adaptive" else int(policy)
                    vocab, adaptive = int(endpoint.info.vocab_size), policy == "adaptive"
                    spec = TargetSpec(gamma, (prof.alpha,) * gamma, prof.tp, prof.tc, vocab, adaptive=adaptive)
                    width = max(max_gamma, *gammas)
                    make = functools.partial(_gamma_target, endpoint.address, endpoint.info, spec, prof.alpha, width)
                    w = await run_window(make, n, warmup, duration)
                    _, tokens = window_counts(w.runs, w.t0, w.t1)
                    used = [g for run in w.runs for g in run.gammas]
                    point = GammaPoint(
                        prof.name, n, policy, tokens / (w.t1 - w.t0), statistics.fmean(used) if used else 0.0
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
