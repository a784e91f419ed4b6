"""The system model (starsd.system_model) against its closed forms, a Monte Carlo of rounds and a discrete-event
simulation of N targets sharing one FIFO draft."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starsd import system_model
from starsd.system_model import BatchCurve, Regime

# --- acceptance -----------------------------------------------------------------------------------


def test_constant_alpha_matches_the_closed_form_by_hand() -> None:
    # (1 - 0.8^5) / (1 - 0.8) = 3.3616 tokens per round, 2.3616 of them accepted drafts.
    assert system_model.expected_tokens_per_round(4, alpha=0.8) == pytest.approx(3.3616)
    assert system_model.expected_accepted_length(4, alpha=0.8) == pytest.approx(2.3616)


def test_acceptance_edge_cases() -> None:
    assert system_model.expected_accepted_length(5, alpha=0.0) == 0.0
    assert system_model.expected_accepted_length(5, alpha=1.0) == 5.0
    assert system_model.expected_tokens_per_round(1, alpha=0.5) == pytest.approx(1.5)


def test_tail_sum_with_per_position_acceptance() -> None:
    # P(l>=1)=0.9, P(l>=2)=0.9*0.5, P(l>=3)=0.45*0.2: E[l] = 0.9 + 0.45 + 0.09.
    assert system_model.expected_accepted_length(3, betas=[0.9, 0.5, 0.2]) == pytest.approx(1.44)
    # A zero stops the chain: nothing after it counts.
    assert system_model.expected_accepted_length(3, betas=[1.0, 0.0, 1.0]) == pytest.approx(1.0)


@settings(deadline=None)
@given(gamma=st.integers(1, 16), alpha=st.floats(0.0, 1.0))
def test_tail_sum_of_constant_betas_equals_the_closed_form(gamma: int, alpha: float) -> None:
    closed = system_model.expected_accepted_length(gamma, alpha=alpha)
    tail_sum = system_model.expected_accepted_length(gamma, betas=[alpha] * gamma)
    assert closed == pytest.approx(tail_sum, rel=1e-9, abs=1e-9)
    assert 0.0 <= closed <= gamma


@settings(deadline=None)
@given(betas=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_length_distribution_is_a_distribution_whose_mean_is_the_tail_sum(betas: list[float]) -> None:
    gamma = len(betas)
    dist = system_model.accepted_length_distribution(gamma, betas=betas)
    assert len(dist) == gamma + 1
    assert all(p >= -1e-12 for p in dist)
    assert math.fsum(dist) == pytest.approx(1.0)
    mean = math.fsum(k * p for k, p in enumerate(dist))
    assert mean == pytest.approx(system_model.expected_accepted_length(gamma, betas=betas), abs=1e-9)


def _simulate_accepted_lengths(betas: list[float], rounds: int, seed: int) -> np.ndarray:
    """Monte Carlo of rounds: position y is accepted with probability beta(y) once 1..y-1 were accepted."""
    rng = np.random.default_rng(seed)
    accepted = rng.random((rounds, len(betas))) < np.asarray(betas)  # [rounds, gamma]
    # l = number of leading accepted positions = index of the first rejection.
    return np.where(accepted.all(axis=1), len(betas), np.argmin(accepted, axis=1))


@pytest.mark.parametrize(
    "betas",
    [[0.8] * 4, [0.95, 0.9, 0.7, 0.6, 0.4, 0.3], [0.5], [0.99] * 8, [0.3, 0.9, 0.9]],
)
def test_monte_carlo_rounds_agree_with_the_model(betas: list[float]) -> None:
    rounds = 200_000
    lengths = _simulate_accepted_lengths(betas, rounds, seed=len(betas))
    gamma = len(betas)
    expected = system_model.expected_accepted_length(gamma, betas=betas)
    stderr = lengths.std() / math.sqrt(rounds)
    assert abs(lengths.mean() - expected) < 5 * stderr + 1e-9
    # The whole distribution, not just its mean.
    observed = np.bincount(lengths, minlength=gamma + 1) / rounds
    dist = system_model.accepted_length_distribution(gamma, betas=betas)
    for k in range(gamma + 1):
        assert abs(observed[k] - dist[k]) < 5 * math.sqrt(dist[k] * (1 - dist[k]) / rounds) + 1e-9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 4}, "exactly one"),
        ({"gamma": 4, "alpha": 0.5, "betas": [0.5] * 4}, "exactly one"),
        ({"gamma": 4, "betas": [0.5] * 3}, "gamma=4"),
        ({"gamma": 4, "alpha": 1.5}, "alpha"),
        ({"gamma": 4, "alpha": float("nan")}, "alpha"),
        ({"gamma": 2, "betas": [0.5, -0.1]}, r"betas\[1\]"),
        ({"gamma": 0, "alpha": 0.5}, "gamma"),
        ({"gamma": 2.0, "alpha": 0.5}, "gamma"),
        ({"gamma": True, "alpha": 0.5}, "gamma"),
    ],
)
def test_bad_acceptance_arguments_raise_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        system_model.expected_accepted_length(**kwargs)  # type: ignore[arg-type]


# --- times, utilisation, regime, N* ---------------------------------------------------------------

TQ, TP, TC = 0.004, 0.020, 0.001  # C = 0.026, N* = ceil(1 + 0.022/0.004) = ceil(6.5) = 7


def test_cycle_utilization_and_regime_by_hand() -> None:
    assert system_model.cycle_time(TQ, TP, TC) == pytest.approx(0.026)
    assert system_model.utilization(1, TQ, TP, TC) == pytest.approx(0.004 / 0.026)
    assert system_model.utilization(6, TQ, TP, TC) == pytest.approx(0.024 / 0.026)
    assert system_model.utilization(7, TQ, TP, TC) == 1.0
    assert system_model.regime(6, TQ, TP, TC) == "UnderLoaded"
    assert system_model.regime(7, TQ, TP, TC) == "FullyLoaded"
    assert system_model.regime(7, TQ, TP, TC) is Regime.FULLY_LOADED
    assert system_model.optimal_targets(TQ, TP, TC) == 7


def test_throughput_grows_linearly_then_caps_at_the_draft_capacity() -> None:
    tokens = system_model.expected_tokens_per_round(4, alpha=0.8)
    assert system_model.throughput(1, TQ, TP, TC, 4, alpha=0.8) == pytest.approx(tokens / 0.026)
    assert system_model.throughput(6, TQ, TP, TC, 4, alpha=0.8) == pytest.approx(6 * tokens / 0.026)
    cap = system_model.draft_capacity(TQ, 4, alpha=0.8)
    assert cap == pytest.approx(tokens / TQ)
    for n in (7, 8, 32):
        assert system_model.throughput(n, TQ, TP, TC, 4, alpha=0.8) == pytest.approx(cap)
    # Past N* each target waits longer per token.
    assert system_model.per_target_latency(32, TQ, TP, TC, 4, alpha=0.8) == pytest.approx(32 * TQ / tokens)
    assert system_model.per_target_latency(3, TQ, TP, TC, 4, alpha=0.8) == pytest.approx(0.026 / tokens)


def test_optimal_targets_is_exact_at_an_integer_boundary() -> None:
    # 1 + (0.2 + 0.1)/0.1 is 4 exactly; floating point must not push it to 5.
    assert system_model.optimal_targets(0.1, 0.2, 0.05) == 4
    assert system_model.regime(4, 0.1, 0.2, 0.05) == "FullyLoaded"
    assert system_model.regime(3, 0.1, 0.2, 0.05) == "UnderLoaded"
    assert system_model.optimal_targets(0.01, 0.0, 0.0) == 1


times = st.floats(1e-4, 1.0)


@settings(deadline=None)
@given(tq=times, tp=times, tc=st.floats(0.0, 0.2), gamma=st.integers(1, 10), alpha=st.floats(0.0, 1.0))
def test_n_star_is_the_fewest_targets_that_keep_the_draft_busy(
    tq: float, tp: float, tc: float, gamma: int, alpha: float
) -> None:
    n_star = system_model.optimal_targets(tq, tp, tc)
    assert n_star >= 1
    assert system_model.regime(n_star, tq, tp, tc) == "FullyLoaded"
    assert system_model.utilization(n_star, tq, tp, tc) == 1.0
    if n_star > 1:
        assert system_model.regime(n_star - 1, tq, tp, tc) == "UnderLoaded"
        assert system_model.utilization(n_star - 1, tq, tp, tc) < 1.0
    # Throughput never falls with N and is flat from N* on.
    prev = 0.0
    for n in range(1, n_star + 3):
        o = system_model.throughput(n, tq, tp, tc, gamma, alpha=alpha)
        assert o >= prev * (1 - 1e-12)
        prev = o
    assert prev == pytest.approx(system_model.draft_capacity(tq, gamma, alpha=alpha))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: system_model.cycle_time(0.0, 0.01, 0.001), "tq"),
        (lambda: system_model.cycle_time(0.004, -0.01, 0.001), "tp"),
        (lambda: system_model.cycle_time(0.004, 0.01, float("inf")), "tc"),
        (lambda: system_model.cycle_time("0.004", 0.01, 0.001), "tq"),  # type: ignore[arg-type]
        (lambda: system_model.utilization(0, 0.004, 0.01, 0.001), "n"),
        (lambda: system_model.throughput(2, 0.004, 0.01, 0.001, gamma=4), "exactly one"),
        (lambda: system_model.regime(1.5, 0.004, 0.01, 0.001), "n"),  # type: ignore[arg-type]
    ],
)
def test_bad_time_arguments_raise_clear_errors(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


# --- discrete-event simulation of the star --------------------------------------------------------


@dataclass
class SimResult:
    throughput: float  # tokens/s over the measured window
    utilization: float  # draft busy fraction over the window
    mean_round: float  # mean seconds between one target's consecutive requests


def simulate_star(
    n: int,
    tq: float,
    tp: float,
    tc: float,
    betas: list[float],
    *,
    max_batch: int = 1,
    tq_of_batch: BatchCurve | None = None,
    rounds_per_target: int = 400,
    seed: int = 0,
) -> SimResult:
    """N targets, one draft. Each target: request travels tc, waits for the draft (FIFO), is served, the
    answer travels tc, the target verifies for tp, commits l+1 tokens (l drawn per position), sends again.
    The draft takes up to ``max_batch`` waiting requests per pass, for ``Tq(B)`` (``tq`` when unbatched).
    The first half of the run is warm-up; measurements cover the second half."""
    rng = np.random.default_rng(seed)
    arrivals: list[tuple[float, int]] = [(tc, i) for i in range(n)]  # (time at the draft, target)
    heapq.heapify(arrivals)
    free_at = 0.0
    busy: list[tuple[float, float]] = []
    commits: list[tuple[float, int]] = []  # (time, tokens)
    sends: dict[int, list[float]] = {i: [] for i in range(n)}
    total = n * rounds_per_target
    served = 0
    while served < total:
        first, _ = arrivals[0]
        start = max(first, free_at)
        batch: list[int] = []
        while arrivals and arrivals[0][0] <= start and len(batch) < max_batch:
            batch.append(heapq.heappop(arrivals)[1])
        service = tq if tq_of_batch is None else tq_of_batch.tq(len(batch))
        free_at = start + service
        busy.append((start, free_at))
        for target in batch:
            done = free_at + tc + tp
            accepted = rng.random(len(betas)) < np.asarray(betas)
            l_acc = len(betas) if accepted.all() else int(np.argmin(accepted))
            commits.append((done, l_acc + 1))
            sends[target].append(done)
            heapq.heappush(arrivals, (done + tc, target))
        served += len(batch)
    end = min(t for t, _ in commits[-n:])
    begin = end / 2
    window = end - begin
    tokens = sum(k for t, k in commits if begin <= t < end)
    busy_time = sum(max(0.0, min(b, end) - max(a, begin)) for a, b in busy)
    gaps = [b - a for s in sends.values() for a, b in itertools.pairwise(s) if a >= begin and b < end]
    return SimResult(tokens / window, busy_time / window, sum(gaps) / len(gaps))


@pytest.mark.parametrize(
    ("tq", "tp", "tc"),
    [(0.004, 0.020, 0.001), (0.004, 0.030, 0.0005), (0.010, 0.025, 0.0025), (0.002, 0.050, 0.002)],
)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 12, 24])
def test_simulated_star_matches_throughput_utilization_and_round_time(tq: float, tp: float, tc: float, n: int) -> None:
    betas = [0.9, 0.8, 0.7, 0.6]
    # ~4000 measured rounds in all: the token count's standard error is ~0.7% of the mean.
    sim = simulate_star(n, tq, tp, tc, betas, rounds_per_target=max(400, 8000 // n), seed=n)
    predicted = system_model.throughput(n, tq, tp, tc, 4, betas=betas)
    assert sim.throughput == pytest.approx(predicted, rel=0.03)
    assert sim.utilization == pytest.approx(system_model.utilization(n, tq, tp, tc), abs=0.01)
    assert sim.mean_round == pytest.approx(system_model.round_time(n, tq, tp, tc), rel=1e-6)


@pytest.mark.parametrize(("tq", "tp", "tc"), [(0.004, 0.020, 0.001), (0.003, 0.017, 0.002)])
def test_simulated_draft_idles_below_n_star_and_never_from_n_star_on(tq: float, tp: float, tc: float) -> None:
    n_star = system_model.optimal_targets(tq, tp, tc)
    below = simulate_star(n_star - 1, tq, tp, tc, [0.8] * 4)
    at = simulate_star(n_star, tq, tp, tc, [0.8] * 4)
    assert below.utilization < 0.99
    assert at.utilization == pytest.approx(1.0, abs=1e-6)
    assert system_model.regime(n_star - 1, tq, tp, tc) == "UnderLoaded"
    assert system_model.regime(n_star, tq, tp, tc) == "FullyLoaded"


# --- batched draft --------------------------------------------------------------------------------


def test_batch_curve_parses_interpolates_and_validates() -> None:
    curve = BatchCurve.parse("8:0.006, 1:0.004")
    assert curve.points == ((1, 0.004), (8, 0.006))
    assert curve.max_batch == 8
    assert curve.tq(1) == pytest.approx(0.004)
    assert curve.tq(4) == pytest.approx(0.004 + 0.002 * 3 / 7)
    assert curve.per_request_time(8) == pytest.approx(0.00075)
    assert curve.best_batch() == 8
    assert curve.batching_gain() == pytest.approx(0.004 / 0.00075)
    for bad, message in [
        ("", "at least one"),
        ("2:0.004", "B=1"),
        ("1:0.004,1:0.005", "twice"),
        ("1:0.004,4:0.003", "must not fall"),
        ("1:0.004,x", "B:SECONDS"),
        ("1:0,2:0.1", "Tq"),
        ("0:0.004", "batch size"),
    ]:
        with pytest.raises(ValueError, match=message):
            BatchCurve.parse(bad)
    with pytest.raises(ValueError, match="exceeds"):
        curve.tq(9)


def test_a_flat_memory_bound_curve_lets_one_draft_feed_many_more_targets() -> None:
    flat = BatchCurve.parse("1:0.004,8:0.005")
    tp, tc = 0.030, 0.001
    unbatched = system_model.optimal_targets(0.004, tp, tc)  # ceil(1 + 0.032/0.004) = 9
    batched = system_model.batched_optimal_targets(flat, tp, tc)  # ceil(8 * (1 + 0.032/0.005)) = 60
    assert (unbatched, batched) == (9, 60)
    assert system_model.batched_capacity(flat, 4, alpha=0.8) == pytest.approx(
        6.4 * system_model.draft_capacity(0.004, 4, alpha=0.8)
    )
    # Batching never lowers the model's throughput, and helps exactly once the unbatched draft saturates.
    for n in range(1, 80):
        plain = system_model.throughput(n, 0.004, tp, tc, 4, alpha=0.8)
        point = system_model.batched_point(n, flat, tp, tc, 4, alpha=0.8)
        assert point.throughput >= plain * (1 - 1e-12)
        if n < unbatched:
            assert point.batch == 1
            assert point.throughput == pytest.approx(plain)
        if n == batched:
            assert point.regime == "FullyLoaded"
            assert point.batch == 8
    # A compute-bound curve (Tq proportional to B) gains nothing.
    linear = BatchCurve.parse("1:0.004,8:0.032")
    assert linear.batching_gain() == pytest.approx(1.0)
    assert system_model.batched_optimal_targets(linear, tp, tc) == unbatched


def test_batched_point_with_a_fixed_batch_by_hand() -> None:
    curve = BatchCurve.parse("1:0.004,8:0.006")
    p = system_model.batched_point(16, curve, 0.030, 0.001, 4, alpha=0.8, batch=8)
    assert p.cycle_time == pytest.approx(0.006 + 0.032)
    assert p.round_time == pytest.approx(0.038)  # 16 * 0.00075 = 0.012 < 0.038
    assert p.utilization == pytest.approx(0.012 / 0.038)
    assert p.regime == "UnderLoaded"
    assert p.throughput == pytest.approx(16 * 3.3616 / 0.038)
    with pytest.raises(ValueError, match="cannot exceed"):
        system_model.batched_point(4, curve, 0.030, 0.001, 4, alpha=0.8, batch=8)


@pytest.mark.parametrize("n", [4, 9, 16, 24, 40, 64])
def test_simulated_batching_draft_reaches_the_batched_model_when_saturated(n: int) -> None:
    # A draft that takes whatever is waiting (up to 8) per pass, simulated: throughput within the model's
    # bound, and at the bound once N is past the batched N*.
    curve = BatchCurve.parse("1:0.004,8:0.005")
    tp, tc = 0.030, 0.001
    betas = [0.8] * 4
    sim = simulate_star(n, 0.004, tp, tc, betas, max_batch=8, tq_of_batch=curve, rounds_per_target=300)
    bound = system_model.batched_throughput(n, curve, tp, tc, 4, betas=betas)
    assert sim.throughput <= bound * 1.03
    if n >= system_model.batched_optimal_targets(curve, tp, tc):
        assert sim.throughput == pytest.approx(bound, rel=0.03)


# --- the plan table -------------------------------------------------------------------------------


def test_plan_marks_n_star_and_matches_the_pointwise_functions() -> None:
    rows = system_model.plan(TQ, TP, TC, 4, alpha=0.8)
    assert [r.n for r in rows] == list(range(1, 15))  # max(8, 2 * N*) with N* = 7
    assert [r.n for r in rows if r.optimal] == [7]
    tokens, cycle = sum(0.8**k for k in range(5)), TQ + TP + 2 * TC  # E[l] + 1 and C, by hand (DESIGN.md 2)
    for r in rows:
        assert r.throughput == pytest.approx(system_model.throughput(r.n, TQ, TP, TC, 4, alpha=0.8))
        assert r.throughput == pytest.approx(r.n * tokens / max(cycle, r.n * TQ))
        assert r.utilization == pytest.approx(system_model.utilization(r.n, TQ, TP, TC))
        assert r.utilization == pytest.approx(min(1.0, r.n * TQ / cycle))
        assert r.regime == system_model.regime(r.n, TQ, TP, TC)
        assert r.regime.value == ("UnderLoaded" if r.n * TQ < cycle else "FullyLoaded")
        assert r.latency_per_token == pytest.approx(system_model.per_target_latency(r.n, TQ, TP, TC, 4, alpha=0.8))
        assert r.latency_per_token == pytest.approx(max(cycle, r.n * TQ) / tokens)
        assert r.per_target_throughput * r.n == pytest.approx(r.throughput)
        assert r.batch == 1
    assert rows[0].to_dict()["regime"] == "UnderLoaded"


def test_plan_with_a_batch_curve_uses_the_batched_n_star() -> None:
    curve = BatchCurve.parse("1:0.004,8:0.006")
    rows = system_model.plan(0.004, 0.030, 0.001, 4, alpha=0.8, ns=[1, 8, 51, 60], batch_curve=curve)
    assert [r.n for r in rows if r.optimal] == [51]
    assert rows[2].regime == "FullyLoaded"
    assert rows[2].batch == 8
    with pytest.raises(ValueError, match="Tq\\(1\\)"):
        system_model.plan(0.005, 0.030, 0.001, 4, alpha=0.8, batch_curve=curve)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 64), tq=times, tp=times, tc=st.floats(0.0, 0.1))
def test_utilization_is_a_fraction_and_throughput_is_positive(n: int, tq: float, tp: float, tc: float) -> None:
    u = system_model.utilization(n, tq, tp, tc)
    assert 0.0 < u <= 1.0
    assert system_model.throughput(n, tq, tp, tc, 3, alpha=0.5) > 0.0
    assert (u == 1.0) == (system_model.regime(n, tq, tp, tc) == "FullyLoaded") or math.isclose(
        n * tq, system_model.cycle_time(tq, tp, tc), rel_tol=1e-9
    )


def test_batch_curve_parse_takes_the_unbatched_time_when_b1_is_missing() -> None:
    assert BatchCurve.parse("8:0.006", unbatched=0.004).points == ((1, 0.004), (8, 0.006))
    # An explicit B=1 point wins over the supplied one.
    assert BatchCurve.parse("1:0.003,8:0.006", unbatched=0.004).tq(1) == 0.003


def test_a_curve_up_to_a_batch_limit_ends_at_that_batch() -> None:
    curve = BatchCurve(((1, 0.004), (4, 0.005), (8, 0.008)))
    assert curve.up_to(8) is curve and curve.up_to(32) is curve
    assert curve.up_to(6).points == ((1, 0.004), (4, 0.005), (6, pytest.approx(0.0065)))
    assert curve.up_to(4).points == ((1, 0.004), (4, 0.005))
    assert curve.up_to(1).points == ((1, 0.004),)


def test_an_unbatched_draft_is_the_one_point_batch_curve() -> None:
    """StarInputs without a curve evaluates the batched formula on ``((1, tq),)``: the closed forms exactly."""
    inputs = system_model.StarInputs(TQ, TP, TC, 4, alpha=0.8)
    assert inputs.curve == BatchCurve(((1, TQ),))
    assert inputs.optimal_targets == system_model.optimal_targets(TQ, TP, TC)
    assert inputs.capacity == system_model.draft_capacity(TQ, 4, alpha=0.8)
    assert inputs.cycle_time == system_model.cycle_time(TQ, TP, TC)
    for n in range(1, 20):
        p = inputs.point(n)
        assert p.batch == 1
        assert p.throughput == system_model.throughput(n, TQ, TP, TC, 4, alpha=0.8)
        assert p.utilization == system_model.utilization(n, TQ, TP, TC)
        assert p.round_time == system_model.round_time(n, TQ, TP, TC)
        assert p.regime is system_model.regime(n, TQ, TP, TC)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tq": -1.0}, "tq"),
        ({"gamma": 0}, "gamma"),
        ({"alpha": None}, "exactly one"),
        ({"batch_curve": BatchCurve(((1, 0.005), (8, 0.006)))}, "Tq\\(1\\)"),
    ],
)
def test_star_inputs_name_what_is_wrong(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {"tq": TQ, "tp": TP, "tc": TC, "gamma": 4, "alpha": 0.8}
    with pytest.raises(ValueError, match=match):
        system_model.StarInputs(**{**base, **kwargs})  # type: ignore[arg-type]
