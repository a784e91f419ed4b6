"""The star benchmark: the real draft server, N emulated targets, a sweep over N, the model alongside.

Processes: the draft runs in its own process (``starsd draft --emulate-service-time ...``, or a real
checkpoint with ``--model``); the N emulated targets (the product's target engine and draft link with an
emulated model runner, :mod:`starsd.bench.emulated`) share this process's asyncio loop. Each sweep point
opens N streams, lets them run for a warm-up, measures for ``duration`` seconds, then lets every target finish
its round and release its session.

Baselines, in the same run:

* target-only decoding: each target alone makes ``1/Tp1`` tokens per second (the profile's measured
  per-token decode time), so N targets make ``N/Tp1``;
* N independent draft+target pairs: pairs share nothing, so N pairs make N times what one pair makes. One
  pair is measured: the N=1 point *is* one target alone on its own draft (the sweep adds it if missing).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starsd import system_model
from starsd.bench import analysis
from starsd.bench.analysis import ModelInputs, PointMeasurement, PointResult
from starsd.bench.emulated import EmulatedTarget, TargetSpec
from starsd.bench.harness import DraftEndpoint, run_window
from starsd.bench.profiles import Profile
from starsd.bench.report import Column, Machine, table

DEFAULT_NS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class StarConfig:
    profile: Profile
    ns: tuple[int, ...]
    duration: float = 10.0  # measured seconds per point
    warmup: float = 1.0  # seconds per point before measuring
    draft_service_time: float | None = None  # emulated Tq; None for a real model draft
    max_batch: int = 1
    seed: int = 0
    session_tokens: int = 512

    @property
    def betas(self) -> tuple[float, ...]:
        return tuple(system_model.position_acceptance(self.profile.gamma, alpha=self.profile.alpha))

    def target_seed(self, point: int, i: int) -> int:
        """Target ``i``'s seed at sweep point ``point`` (its acceptance draws, its prompts)."""
        return self.seed * 100_003 + point * 1_009 + i

    def target_spec(self, vocab_size: int) -> TargetSpec:
        p = self.profile
        return TargetSpec(p.gamma, self.betas, p.tp, p.tc, vocab_size, session_tokens=self.session_tokens)

    def model_inputs(self, measured_tq: float | None = None) -> ModelInputs:
        p = self.profile
        tq = self.draft_service_time if self.draft_service_time is not None else measured_tq
        if tq is None or tq <= 0:
            raise ValueError("the draft's service time is unknown (no emulated time and no measurement)")
        return ModelInputs(
            tq=tq, tp=p.tp, tc=p.tc, gamma=p.gamma, betas=self.betas, max_batch=self.max_batch, curve=p.curve()
        )


def sweep_ns(requested: tuple[int, ...] | None, n_star: int) -> tuple[int, ...]:
    """The N to measure: the requested ones (default 1,2,4,8,16,32 plus N* when N* <= 64), always with 1."""
    ns = set(requested or DEFAULT_NS)
    if requested is None and n_star <= 64:
        ns.add(n_star)
    ns.add(1)  # the measured pair behind the N-pairs baseline
    return tuple(sorted(ns))


async def measure_point(endpoint: DraftEndpoint, n: int, spec: TargetSpec, cfg: StarConfig) -> PointMeasurement:
    def make(i: int) -> EmulatedTarget:
        return EmulatedTarget(f"bench-n{n}-t{i}", endpoint.address, endpoint.info, spec, cfg.target_seed(n, i))

    w = await run_window(make, n, cfg.warmup, cfg.duration, endpoint, strict=False)
    d = w.change
    assert d is not None
    # The draft's own busy counter across the window; without it, the targets' view stands in.
    busy = d.samples.get("starsd_draft_busy_seconds_total")
    return PointMeasurement(
        n, w.runs, w.t0, w.t1, busy, d.wall if busy is not None else None, d.load, d.draft_cpu, d.cpu, w.loop_lags
    )


@dataclass(frozen=True)
class ModelInputsRecord:
    """The model's inputs as the report states them."""

    tq: float
    tq_source: str  # "emulated service time" | "measured mean"
    tp: float
    tc: float
    gamma: int
    alpha: float
    expected_tokens_per_round: float
    cycle_time: float
    optimal_targets: int


UNITS = {
    "throughput": "tokens/s, all targets",
    "latency": "seconds per round of one target (request to its next request)",
    "utilization": "draft busy fraction from its busy-seconds counter over the window",
}
BASELINES = {
    "target_only": "N / Tp1: each target decoding alone at the profile's per-token time",
    "pairs": "N x the measured N=1 point (one target alone on one draft); pairs share nothing",
}


@dataclass(frozen=True)
class AtNStar:
    """The star against its baselines at the first measured N >= N*."""

    n: int
    star_throughput_per_draft: float
    pairs_throughput_per_draft: float
    star_over_pairs_per_draft: float | None
    star_total_over_target_only: float
    pairs_total_over_target_only: float
    accelerators: dict[str, int]


@dataclass(frozen=True)
class StarSummary:
    optimal_targets: int
    min_ratio: float
    min_round_ratio: float
    min_ratio_measured_inputs: float | None
    max_utilization_error_measured_inputs: float | None
    max_idle_fraction_fully_loaded: float | None
    max_utilization_error_under_loaded: float | None
    goals: dict[str, bool | None]
    # The same goals against the model fed the measured service, verify and loopback transfer times: what is
    # left is the implementation's own overhead, not the host's transport cost (None: nothing measured).
    goals_with_measured_inputs: dict[str, bool | None]
    at_n_star: AtNStar
    errors: int
    profile: str


@dataclass
class StarReport:
    """What the sweep ran, the model's inputs it used, the machine it ran on, the summary and every point."""

    config: StarConfig
    draft: str  # "emulated" | "model"
    model_inputs: ModelInputsRecord
    measured_service_time: float | None
    machine: Machine
    summary: StarSummary
    results: list[PointResult]
    units: dict[str, str] = field(default_factory=lambda: dict(UNITS))
    baselines: dict[str, str] = field(default_factory=lambda: dict(BASELINES))

    def table(self) -> str:
        return format_table(self)


async def run_star(cfg: StarConfig, endpoint: DraftEndpoint, progress: Any = None) -> StarReport:
    """Sweep ``cfg.ns`` against a serving draft; baselines and the summary included."""
    spec = cfg.target_spec(int(endpoint.info.vocab_size))
    measurements: list[PointMeasurement] = []
    machine = Machine.now()
    for n in cfg.ns:
        m = await measure_point(endpoint, n, spec, cfg)
        measurements.append(m)
        if progress:
            progress(n, m)
        await asyncio.sleep(0.2)  # let the draft drop the point's streams and sessions
    measured_tq = _mean_service(measurements)
    inputs = cfg.model_inputs(measured_tq)
    results = [analysis.summarize(m, inputs) for m in measurements]
    pair = next(r for r in results if r.n == 1)
    pair_model = inputs.point(1)[0]
    transfer = pair.overhead_p50 / 2  # one way: the N=1 round trip minus service, where nothing queues
    for r in results:
        r.target_only_throughput = r.n / cfg.profile.tp1
        r.pairs_throughput = r.n * pair.throughput
        r.pairs_model_throughput = r.n * pair_model
        analysis.apply_measured_model(r, inputs, transfer)
    emulated = cfg.draft_service_time is not None
    model_inputs = ModelInputsRecord(
        tq=inputs.tq,
        tq_source="emulated service time" if emulated else "measured mean",
        tp=inputs.tp,
        tc=inputs.tc,
        gamma=inputs.gamma,
        alpha=cfg.profile.alpha,
        expected_tokens_per_round=inputs.tokens_per_round,
        cycle_time=system_model.cycle_time(inputs.tq, inputs.tp, inputs.tc),
        optimal_targets=inputs.optimal_targets(),
    )
    draft = "emulated" if emulated else "model"
    summary = summarize_star(results, inputs, cfg.profile)
    return StarReport(cfg, draft, model_inputs, measured_tq, machine.finished(), summary, results)


def _mean_service(measurements: list[PointMeasurement]) -> float | None:
    services = [r.service for m in measurements for run in m.runs for r in run.rounds]
    return sum(services) / len(services) if services else None


def summarize_star(results: list[PointResult], inputs: ModelInputs, profile: Profile) -> StarSummary:
    """The figures the issue asks for: the goals' verdicts and the star against its baselines at N*."""
    n_star = inputs.optimal_targets()
    pair = next(r for r in results if r.n == 1)
    at = min((r for r in results if r.n >= n_star), key=lambda r: r.n, default=results[-1])
    under = [r for r in results if r.regime == "UnderLoaded"]
    full = [r for r in results if r.regime == "FullyLoaded"]
    measured = [r for r in results if r.model_measured_throughput > 0]
    nominal = [(r.ratio, r.utilization, r.model_utilization, r.regime == "FullyLoaded") for r in results]
    fed = [(r.ratio_measured, r.utilization, r.model_measured_utilization) for r in measured]
    return StarSummary(
        optimal_targets=n_star,
        min_ratio=min(r.ratio for r in results),
        min_round_ratio=min(r.round_ratio for r in results),
        min_ratio_measured_inputs=min((r.ratio_measured for r in measured), default=None),
        max_utilization_error_measured_inputs=max(
            (abs(r.utilization - r.model_measured_utilization) for r in measured), default=None
        ),
        max_idle_fraction_fully_loaded=max((r.idle_fraction for r in full), default=None),
        max_utilization_error_under_loaded=max((abs(r.utilization - r.model_utilization) for r in under), default=None),
        goals=_goals(nominal),
        goals_with_measured_inputs=_goals([(*row, row[2] >= 1.0) for row in fed]) if fed else dict.fromkeys(GOALS),
        at_n_star=AtNStar(
            n=at.n,
            star_throughput_per_draft=at.throughput,
            pairs_throughput_per_draft=pair.throughput,
            star_over_pairs_per_draft=at.throughput / pair.throughput if pair.throughput else None,
            star_total_over_target_only=at.throughput / at.target_only_throughput,
            pairs_total_over_target_only=at.pairs_throughput / at.target_only_throughput,
            accelerators={"star": at.n + 1, "pairs": 2 * at.n, "target_only": at.n},
        ),
        errors=sum(len(r.errors) for r in results),
        profile=profile.name,
    )


GOALS = ("ratio_at_least_0.95", "idle_at_most_3pct_fully_loaded", "utilization_within_5_points_under_loaded")


def _goals(rows: list[tuple[float, float, float, bool]]) -> dict[str, bool | None]:
    """The goals' verdicts over (ratio, utilization, the model's utilization, fully loaded) per point."""
    verdicts = (
        all(ratio >= 0.95 for ratio, *_ in rows),
        all(1.0 - util <= 0.03 for _, util, _, full in rows if full),
        all(abs(util - model) <= 0.05 for _, util, model, full in rows if not full),
    )
    return dict(zip(GOALS, verdicts, strict=True))


def _cpu(r: PointResult) -> str | None:
    if r.draft_cpu is None and r.targets_cpu is None:
        return None
    return f"{(r.draft_cpu or 0) * 100:.0f}/{(r.targets_cpu or 0) * 100:.0f}%"


def _nonzero(value: float) -> float | None:
    """A figure that does not apply is 0.0 in the record and a dash in the table."""
    return value or None


POINT_COLUMNS: list[Column[PointResult]] = [
    Column("N", lambda r: r.n, "d", 3),
    Column("regime", lambda r: r.regime, "", 11, left=True),
    Column("tok/s", lambda r: r.throughput, ".1f", 8),
    Column("model", lambda r: r.model_throughput, ".1f", 8),
    Column("ratio", lambda r: r.ratio, ".3f", 6),
    Column("rnd", lambda r: r.round_ratio, ".3f", 6),
    Column("m-rat", lambda r: _nonzero(r.ratio_measured), ".3f", 6),
    Column("util", lambda r: r.utilization, ".1f", 6, scale=100, unit="%"),
    Column("model", lambda r: r.model_utilization, ".1f", 6, scale=100, unit="%"),
    Column("m-util", lambda r: _nonzero(r.model_measured_utilization), ".1f", 6, scale=100, unit="%"),
    Column("idle", lambda r: r.idle_fraction, ".1f", 6, scale=100, unit="%"),
    Column("gaps/s", lambda r: r.idle_gaps_per_second, ".1f", 7),
    Column("p50 ms", lambda r: r.latency_p50, ".2f", 7, scale=1e3),
    Column("p99 ms", lambda r: r.latency_p99, ".2f", 7, scale=1e3),
    Column("mdl ms", lambda r: r.model_round_time, ".2f", 7, scale=1e3),
    Column("pairs", lambda r: r.pairs_throughput, ".1f", 8),
    Column("tgt-only", lambda r: r.target_only_throughput, ".1f", 8),
    Column("cpu d/t", _cpu, "", 9),
]


def _verdicts(goals: dict[str, bool] | dict[str, bool | None]) -> str:
    return ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in goals.items())


def format_table(report: StarReport) -> str:
    cfg, s = report.config, report.summary
    mi, p = report.model_inputs, cfg.profile
    lines = [
        f"profile {p.name} [{p.kind}]: Tq={mi.tq * 1e3:.3f} ms ({mi.tq_source}), "
        f"Tp={mi.tp * 1e3:.3f} ms, Tc={mi.tc * 1e3:.3f} ms, gamma={mi.gamma}, alpha={mi.alpha}, "
        f"E[l]+1={mi.expected_tokens_per_round:.3f}, N*={mi.optimal_targets}",
        f"{cfg.duration:.1f} s measured per point after {cfg.warmup:.1f} s of warm-up; "
        f"latency = one target's round (request to next request); {report.machine.describe()}",
        "",
    ]
    head, *rows = table(report.results, POINT_COLUMNS, sep=" ")
    lines += [head, "-" * len(head)]
    for r, row in zip(report.results, rows, strict=True):
        lines.append(row)
        if r.errors:
            lines.append(f"    {len(r.errors)} target errors, first: {r.errors[0]}")
    a = s.at_n_star
    lines += [
        "",
        "ratio = measured/model tokens/s; rnd = the same for rounds/s (free of acceptance luck); "
        "m-rat, m-util = against the model fed the measured Tq, Tp and loopback Tc; "
        "cpu d/t = draft/targets process CPU",
        f"at N={a.n} (N*={s.optimal_targets}): star {a.star_throughput_per_draft:.1f} tok/s per draft "
        f"accelerator vs {a.pairs_throughput_per_draft:.1f} for a pair "
        f"(x{a.star_over_pairs_per_draft or 0.0:.2f}); total x{a.star_total_over_target_only:.2f} over "
        f"target-only decoding (pairs: x{a.pairs_total_over_target_only:.2f}, with {a.n} drafts)",
        f"goals: {_verdicts(s.goals)}; min ratio {s.min_ratio:.3f}",
    ]
    gm = s.goals_with_measured_inputs
    if all(v is not None for v in gm.values()) and s.min_ratio_measured_inputs is not None:
        lines.append(
            f"goals against the model fed measured times: {_verdicts(gm)}; "
            f"min m-ratio {s.min_ratio_measured_inputs:.3f}"
        )
    return "\n".join(lines)
