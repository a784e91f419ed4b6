"""The benchmark's arithmetic on hand-made records: windows, utilisation, idle gaps, latency, the system_model."""

from __future__ import annotations

import pytest

from starsd import system_model
from starsd.bench.analysis import ModelInputs, PointMeasurement, idle_gaps, summarize
from starsd.bench.emulated import Round, TargetRun
from starsd.bench.report import percentile

TQ, TP, TC = 0.004, 0.010, 0.001  # C = 0.016, N* = 4
INPUTS = ModelInputs(tq=TQ, tp=TP, tc=TC, gamma=4, betas=(0.8,) * 4)


def ideal_runs(n: int, rounds: int, tokens: int = 3) -> list[TargetRun]:
    """N targets on a FIFO draft, exactly as the model says (deterministic times)."""
    c = TQ + TP + 2 * TC
    period = max(c, n * TQ)
    runs = []
    for i in range(n):
        run = TargetRun(f"t{i}")
        for k in range(rounds):
            sent = k * period + i * TQ
            received = sent + 2 * TC + TQ  # request and answer travel, one service
            run.rounds.append(Round(sent, received, received + TP, tokens, tokens - 1, TQ))
            run.verify_actual.append(TP + 2 * TC)
        runs.append(run)
    return runs


def test_percentile_interpolates_and_handles_edges() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_idle_gaps_merge_overlaps_and_clip_to_the_window() -> None:
    intervals = [(0.0, 1.0), (0.5, 1.5), (2.0, 3.0), (3.0, 3.5), (4.0, 5.0)]
    assert idle_gaps(intervals, 0.0, 10.0) == [0.5, 0.5]
    assert idle_gaps(intervals, 2.5, 4.5) == [0.5]
    assert idle_gaps([], 0.0, 1.0) == []


def test_an_ideal_under_loaded_run_matches_the_model_exactly() -> None:
    n, rounds = 2, 200
    runs = ideal_runs(n, rounds, tokens=3)
    c = TQ + TP + 2 * TC
    m = PointMeasurement(n=n, runs=runs, t0=10 * c, t1=110 * c, busy_seconds=100 * c * n * TQ / c, busy_span=100 * c)
    r = summarize(m, INPUTS)
    assert r.rounds_per_second == pytest.approx(n / c)
    assert r.throughput == pytest.approx(3 * n / c)
    assert r.round_ratio == pytest.approx(1.0)
    assert r.ratio == pytest.approx(3 / system_model.expected_tokens_per_round(4, alpha=0.8))
    assert r.utilization == pytest.approx(n * TQ / c)
    assert r.utilization_targets_view == pytest.approx(n * TQ / c, abs=1e-9)
    assert r.model_utilization == pytest.approx(n * TQ / c)
    assert r.latency_p50 == pytest.approx(c) and r.latency_p99 == pytest.approx(c)
    assert r.model_round_time == pytest.approx(c)
    assert r.draft_wait_p50 == pytest.approx(TQ + 2 * TC)
    assert r.overhead_p50 == pytest.approx(2 * TC)
    assert r.regime == "UnderLoaded"
    # The draft serves the two targets back to back, then idles: one gap per cycle.
    assert r.idle_gaps_per_second == pytest.approx(1 / c, rel=0.02)
    assert r.idle_fraction == pytest.approx(1 - n * TQ / c)


def test_a_saturated_run_has_no_idle_gaps() -> None:
    n = 8  # > N* = 4: the draft serves back to back
    runs = ideal_runs(n, 100)
    period = n * TQ
    m = PointMeasurement(n=n, runs=runs, t0=5 * period, t1=95 * period)
    r = summarize(m, INPUTS)
    assert r.utilization == pytest.approx(1.0)  # the targets' view, with no counter given
    assert r.idle_gaps_per_second == 0.0
    assert r.regime == "FullyLoaded"
    assert r.latency_p50 == pytest.approx(period)
    assert r.model_round_time == pytest.approx(period)
    assert r.round_ratio == pytest.approx(1.0, rel=0.01)  # a round more or less at the window's edges


def test_rounds_outside_the_window_do_not_count_and_errors_are_reported() -> None:
    runs = ideal_runs(1, 50)
    runs[0].error = "AioRpcError: boom"
    c = TQ + TP + 2 * TC
    r = summarize(PointMeasurement(n=1, runs=runs, t0=0.0, t1=10 * c), INPUTS)
    assert r.rounds == 9  # commits at c, 2c, ..., 9c; the one at 10c = t1 is outside
    assert r.errors == ["t0: AioRpcError: boom"]
    with pytest.raises(ValueError, match="empty"):
        summarize(PointMeasurement(n=1, runs=runs, t0=1.0, t1=1.0), INPUTS)


def test_batched_model_inputs_use_the_curve_up_to_max_batch() -> None:
    curve = system_model.BatchCurve.parse("1:0.004,4:0.005,8:0.006")
    batched = ModelInputs(tq=0.004, tp=0.030, tc=0.001, gamma=4, betas=(0.8,) * 4, max_batch=4, curve=curve)
    tp_, util, rt, regime = batched.point(64)
    clipped = system_model.BatchCurve.parse("1:0.004,4:0.005")
    assert tp_ == pytest.approx(system_model.batched_throughput(64, clipped, 0.030, 0.001, 4, alpha=0.8))
    assert regime == "FullyLoaded" and util == 1.0
    assert rt == pytest.approx(64 * 0.005 / 4)
    unbatched = ModelInputs(tq=0.004, tp=0.030, tc=0.001, gamma=4, betas=(0.8,) * 4, curve=curve)
    assert unbatched.point(64)[0] == pytest.approx(system_model.throughput(64, 0.004, 0.030, 0.001, 4, alpha=0.8))


def test_the_model_fed_measured_times_explains_a_slower_run() -> None:
    from starsd.bench.analysis import apply_measured_model

    # Every round 2 ms slower than nominal (say, transport): the nominal model overestimates, the model fed
    # the measured transfer does not.
    runs = ideal_runs(2, 200)
    for run in runs:
        run.rounds = [
            Round(r.sent + 0.002 * k, r.received + 0.002 * k + 0.002, r.committed + 0.002 * (k + 1), 3, 2, TQ)
            for k, r in enumerate(run.rounds)
        ]
    c = TQ + TP + 2 * TC + 0.002
    r = summarize(PointMeasurement(n=2, runs=runs, t0=10 * c, t1=150 * c), INPUTS)
    assert r.round_ratio < 0.9
    apply_measured_model(r, INPUTS, transfer=TC + 0.001)
    assert r.model_measured_utilization == pytest.approx(2 * TQ / (TQ + r.verify_mean + 2 * (TC + 0.001)))
    expected = system_model.throughput(2, TQ, r.verify_mean, TC + 0.001, 4, alpha=0.8)
    assert r.model_measured_throughput == pytest.approx(expected)
    assert r.ratio_measured == pytest.approx(r.throughput / expected)
