"""From one sweep point's raw records to the figures the star benchmark reports (pure functions).

Throughput counts the tokens committed inside the measurement window ``[t0, t1)``. Draft utilisation comes
from the draft's own busy-seconds counter read at both ends of the window; the targets' view of it (the
service times the draft reported, placed where their answers arrived) is kept alongside, and gives the
draft's idle gaps. Latency is one target's round: from one request to its next (queueing, draft service,
transfer and verify included), the quantity the model calls ``max(C, N*Tq)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from starsd import system_model
from starsd.bench.emulated import Round, TargetRun
from starsd.bench.report import percentile

# Gaps shorter than this between two services, seen from the targets, are jitter of the return path.
MIN_GAP_SECONDS = 100e-6


@dataclass(frozen=True)
class ModelInputs:
    """What the model's O(N) is evaluated with for the benchmark's ratio."""

    tq: float  # draft service time per request (the emulated time, or the measured mean for a real draft)
    tp: float
    tc: float
    gamma: int
    betas: tuple[float, ...]
    max_batch: int = 1
    curve: system_model.BatchCurve | None = None

    @cached_property
    def model(self) -> system_model.StarInputs:
        """The system model's inputs: with batching, the curve up to ``max_batch`` (its ``Tq(1)`` as ``tq``)."""
        curve = self.curve.up_to(self.max_batch) if self.max_batch > 1 and self.curve is not None else None
        tq = curve.tq(1) if curve is not None else self.tq
        return system_model.StarInputs(tq, self.tp, self.tc, self.gamma, betas=self.betas, batch_curve=curve)

    @property
    def tokens_per_round(self) -> float:
        return self.model.tokens_per_round

    def optimal_targets(self) -> int:
        """N*: with batching, the batched one (the draft saturated at its best batch up to ``max_batch``)."""
        return self.model.optimal_targets

    def point(self, n: int) -> tuple[float, float, float, str]:
        """(throughput, utilisation, round time, regime) of the model at ``n`` targets."""
        p = self.model.point(n)
        return p.throughput, p.utilization, p.round_time, str(p.regime)


@dataclass
class PointMeasurement:
    """Raw records of one sweep point."""

    n: int
    runs: list[TargetRun]
    t0: float  # measurement window (time.perf_counter of the targets' process)
    t1: float
    busy_seconds: float | None = None  # draft's busy-seconds counter difference across the window
    busy_span: float | None = None  # wall time between the two counter reads
    load: dict[str, Any] | None = None  # the draft's /v1/load at the end of the window
    draft_cpu_seconds: float | None = None  # CPU time of the draft process over the window
    targets_cpu_seconds: float | None = None  # CPU time of the targets' process over the window
    loop_lags: list[float] = field(default_factory=list)


@dataclass
class PointResult:
    """One row of the benchmark: measured, the model, and where the time went."""

    n: int
    throughput: float  # tokens/s, all targets
    model_throughput: float
    ratio: float  # throughput / model_throughput
    rounds_per_second: float
    round_ratio: float  # rounds/s against the model's: the ratio without the luck of acceptance draws
    tokens_per_round: float  # measured mean (the model's E[l]+1 is in the run's config)
    utilization: float  # draft busy fraction (the draft's counter; the targets' view if unavailable)
    model_utilization: float
    utilization_targets_view: float
    idle_fraction: float  # 1 - utilization
    idle_gaps_per_second: float  # gaps between draft services, seen from the targets
    idle_gap_mean: float
    idle_gap_p99: float
    idle_gap_max: float
    regime: str  # the model's
    load_regime: str | None  # what the draft's /v1/load said
    latency_p50: float  # seconds per round of one target (request to next request)
    latency_p99: float
    model_round_time: float
    latency_per_token: float  # mean round time / mean tokens per round
    model_latency_per_token: float
    draft_wait_p50: float  # request sent -> proposal received (queueing + service + transfer)
    draft_wait_p99: float
    service_mean: float  # the draft's reported compute time per request
    verify_mean: float  # what the targets actually slept per round (verify + emulated wire)
    overhead_p50: float  # draft wait minus service at the median: transfer (and queueing when loaded)
    rounds: int
    tokens: int
    window_seconds: float
    draft_cpu: float | None  # CPU seconds per second of the draft process
    targets_cpu: float | None  # CPU seconds per second of the targets' process
    loop_lag_p99: float
    loop_lag_max: float
    load: dict[str, Any] | None
    errors: list[str]
    target_only_throughput: float = 0.0  # baselines, filled in by the sweep
    pairs_throughput: float = 0.0
    pairs_model_throughput: float = 0.0
    # The model fed this point's measured times (draft service, verify + wire, loopback transfer at N=1)
    # instead of the nominal ones: how well it predicts when given live measurements, as the operator does.
    model_measured_throughput: float = 0.0
    model_measured_utilization: float = 0.0
    ratio_measured: float = 0.0


def apply_measured_model(r: PointResult, inputs: ModelInputs, transfer: float) -> None:
    """Fill the ``*_measured`` fields: the model with Tq = the point's mean service, Tp = what the targets
    slept (verify and emulated wire), Tc = ``transfer`` (one way, measured where nothing queues)."""
    if r.service_mean <= 0 or r.rounds == 0 or inputs.max_batch > 1:
        return  # with batching an answer reports its share of a pass, not the pass it waited for: n/a
    measured = system_model.StarInputs(
        r.service_mean, r.verify_mean, max(0.0, transfer), inputs.gamma, betas=inputs.betas
    )
    point = measured.point(r.n)
    r.model_measured_throughput = point.throughput
    r.model_measured_utilization = point.utilization
    r.ratio_measured = r.throughput / r.model_measured_throughput if r.model_measured_throughput else 0.0


def busy_inside(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """Busy intervals (start, end) clipped to ``[t0, t1)``, overlaps merged, in order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((max(s, t0), min(e, t1)) for s, e in intervals if e > t0 and s < t1):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def idle_gaps(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> list[float]:
    """Gaps between busy intervals (start, end) inside ``[t0, t1)``, after merging overlaps."""
    return [b[0] - a[1] for a, b in itertools.pairwise(busy_inside(intervals, t0, t1))]


def summarize(m: PointMeasurement, inputs: ModelInputs) -> PointResult:
    window = m.t1 - m.t0
    if window <= 0:
        raise ValueError("the measurement window is empty")
    rounds: list[Round] = [r for run in m.runs for r in run.rounds]
    inside = [r for r in rounds if m.t0 <= r.committed < m.t1]
    tokens = sum(r.tokens for r in inside)
    throughput = tokens / window
    rps = len(inside) / window
    model_tp, model_util, model_rt, regime = inputs.point(m.n)
    expected_tokens = inputs.tokens_per_round
    model_rps = model_tp / expected_tokens

    received = [r for r in rounds if m.t0 <= r.received < m.t1]
    # The draft serves one batch at a time: with batching, answers of one pass report a share of its time.
    services = [(r.received - r.service, r.received) for r in rounds]
    busy_targets = sum(e - s for s, e in busy_inside(services, m.t0, m.t1))
    util_targets = min(1.0, busy_targets / window)
    counted = m.busy_seconds is not None and bool(m.busy_span)
    utilization = min(1.0, (m.busy_seconds or 0.0) / (m.busy_span or 1.0)) if counted else util_targets
    gaps = [g for g in idle_gaps(services, m.t0, m.t1) if g >= MIN_GAP_SECONDS]

    cycles: list[float] = []
    for run in m.runs:
        sends = [r.sent for r in run.rounds]
        cycles += [b - a for a, b in itertools.pairwise(sends) if m.t0 <= a and b < m.t1]
    waits = [r.received - r.sent for r in received]
    mean_tokens = tokens / len(inside) if inside else 0.0
    verify = [v for run in m.runs for v in run.verify_actual]
    lat_token = (sum(cycles) / len(cycles)) / mean_tokens if cycles and mean_tokens else 0.0
    return PointResult(
        n=m.n,
        throughput=throughput,
        model_throughput=model_tp,
        ratio=throughput / model_tp,
        rounds_per_second=rps,
        round_ratio=rps / model_rps,
        tokens_per_round=mean_tokens,
        utilization=utilization,
        model_utilization=model_util,
        utilization_targets_view=util_targets,
        idle_fraction=max(0.0, 1.0 - utilization),
        idle_gaps_per_second=len(gaps) / window,
        idle_gap_mean=sum(gaps) / len(gaps) if gaps else 0.0,
        idle_gap_p99=percentile(gaps, 0.99),
        idle_gap_max=max(gaps, default=0.0),
        regime=regime,
        load_regime=str(m.load["regime"]) if m.load and "regime" in m.load else None,
        latency_p50=percentile(cycles, 0.5),
        latency_p99=percentile(cycles, 0.99),
        model_round_time=model_rt,
        latency_per_token=lat_token,
        model_latency_per_token=model_rt / expected_tokens,
        draft_wait_p50=percentile(waits, 0.5),
        draft_wait_p99=percentile(waits, 0.99),
        service_mean=sum(r.service for r in received) / len(received) if received else 0.0,
        verify_mean=sum(verify) / len(verify) if verify else 0.0,
        overhead_p50=percentile([r.received - r.sent - r.service for r in received], 0.5),
        rounds=len(inside),
        tokens=tokens,
        window_seconds=window,
        draft_cpu=m.draft_cpu_seconds / window if m.draft_cpu_seconds is not None else None,
        targets_cpu=m.targets_cpu_seconds / window if m.targets_cpu_seconds is not None else None,
        loop_lag_p99=percentile(m.loop_lags, 0.99),
        loop_lag_max=max(m.loop_lags, default=0.0),
        load=m.load,
        errors=[f"{run.target_id}: {run.error}" for run in m.runs if run.error],
    )
