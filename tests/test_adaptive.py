"""Adaptive gamma follows the system model: long proposals while the draft idles, short when it is the bottleneck."""

from __future__ import annotations

import pytest

from starsd.adaptive import AcceptanceEstimate, choose_gamma, ewma, session_throughput
from starsd.system_model import throughput


def by_hand(gamma: int, alpha: float, token_time: float, tp: float, tc: float, sessions: int) -> float:
    """One session's tokens per second from DESIGN.md section 2 written out (no starsd code): a round commits
    ``E[l] + 1 = sum_{k=0..gamma} alpha^k`` tokens and lasts ``max(C, N * Tq)``, ``Tq = gamma * token_time``."""
    tq = gamma * token_time
    return sum(alpha**k for k in range(gamma + 1)) / max(tq + tp + 2 * tc, sessions * tq)


def test_the_policy_objective_is_the_system_model_per_session() -> None:
    for n in (1, 4, 32):
        for gamma in (1, 4, 8):
            per_session = session_throughput(gamma, 0.7, 0.001, 0.03, 0.002, n)
            assert per_session == pytest.approx(by_hand(gamma, 0.7, 0.001, 0.03, 0.002, n))
            assert per_session * n == pytest.approx(throughput(n, gamma * 0.001, 0.03, 0.002, gamma, alpha=0.7))


def test_an_idle_draft_and_good_acceptance_ask_for_long_proposals() -> None:
    assert choose_gamma(alpha=0.9, token_time=0.0005, tp=0.03, tc=0.001, sessions=1, max_gamma=8) == 8


def test_a_saturated_draft_gets_shorter_proposals() -> None:
    idle = choose_gamma(alpha=0.8, token_time=0.002, tp=0.03, tc=0.001, sessions=2, max_gamma=8)
    busy = choose_gamma(alpha=0.8, token_time=0.002, tp=0.03, tc=0.001, sessions=64, max_gamma=8)
    assert busy < idle


def test_poor_acceptance_gets_shorter_proposals() -> None:
    good = choose_gamma(alpha=0.9, token_time=0.004, tp=0.02, tc=0.001, sessions=1, max_gamma=8)
    poor = choose_gamma(alpha=0.2, token_time=0.004, tp=0.02, tc=0.001, sessions=1, max_gamma=8)
    assert poor < good


def test_the_choice_is_the_best_gamma_by_exhaustive_comparison() -> None:
    args = dict(alpha=0.75, token_time=0.003, tp=0.025, tc=0.002, sessions=6)
    chosen = choose_gamma(max_gamma=10, **args)  # type: ignore[arg-type]
    values = {g: by_hand(g, 0.75, 0.003, 0.025, 0.002, 6) for g in range(1, 11)}
    assert values[chosen] == pytest.approx(max(values.values()))
    assert chosen == min(g for g, v in values.items() if v == pytest.approx(max(values.values())))  # smaller on ties


def test_no_measurement_keeps_the_configured_gamma() -> None:
    assert choose_gamma(alpha=0.5, token_time=0.0, tp=0.0, tc=0.0, sessions=1, max_gamma=5) == 5


def test_acceptance_estimate_follows_observed_rounds() -> None:
    est = AcceptanceEstimate()
    for _ in range(300):
        est.update(accepted=4, drafted=4)  # everything accepted
    high = est.alpha
    for _ in range(300):
        est.update(accepted=0, drafted=4)  # nothing accepted
    assert high > 0.95 and est.alpha < 0.05
    est.update(accepted=0, drafted=0)  # a round without a draft changes nothing
    with pytest.raises(ValueError):
        choose_gamma(0.5, 0.001, 0.01, 0.0, 1, max_gamma=0)


def test_ewma_starts_at_the_first_sample_then_moves_a_tenth_of_the_way() -> None:
    mean = ewma(float("nan"), 2.0)
    assert mean == 2.0
    assert ewma(mean, 12.0) == pytest.approx(3.0)
