"""The in-process star forces acceptance after a real forward pass exactly, with the model's distribution, and
composes a star of N targets from the measured steps."""

from __future__ import annotations

import statistics

import pytest
import torch

from starsd import system_model
from starsd.bench.inproc_star import forced_accepts, forcing, run_point
from starsd.bench.measure_gpu import load_model
from starsd.verifier.runner import greedy_verdict


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_forced_accepts_follow_the_models_distribution(alpha: float) -> None:
    gamma = 4
    accepts = forced_accepts(400, gamma, alpha)
    assert set(accepts) <= set(range(gamma + 1))
    assert statistics.fmean(accepts) == pytest.approx(system_model.expected_accepted_length(gamma, alpha), rel=0.02)
    for y in range(1, gamma + 1):  # P(l >= y) = alpha^y
        assert sum(a >= y for a in accepts) / len(accepts) == pytest.approx(alpha**y, abs=0.02)


@pytest.mark.parametrize("accept", [0, 2, 4])
def test_forcing_makes_greedy_verification_accept_exactly_l_drafts(accept: int) -> None:
    logits = torch.randn(5, 32, generator=torch.Generator().manual_seed(accept))  # [gamma + 1, V]
    drafts = [3, 7, 7, 1]
    forced = forcing(drafts, accept)(logits)
    accepted, last = greedy_verdict(torch.tensor([drafts]), torch.tensor([4]), forced.unsqueeze(0))
    assert int(accepted) == accept
    if accept < 4:
        assert int(last) != drafts[accept]  # the correction is another token
    assert torch.equal(forced[accept + 1 :], logits[accept + 1 :])  # later positions untouched


def test_a_tiny_star_reports_tokens_the_alone_rate_and_the_prediction() -> None:
    draft, target = load_model("tiny", "cpu", "float32"), load_model("tiny", "cpu", "float32")
    point = run_point(draft, target, 2, 4, 0.7, 16, 5)
    assert point.targets == 2 and point.rounds == 5
    assert 2 * 5 <= point.tokens <= 2 * 5 * 5  # between 1 and gamma + 1 tokens a round
    assert point.mean_accepted == pytest.approx((point.tokens - 10) / 10)
    assert point.prediction_from == "this run's means" and point.predicted_tokens_per_s > 0
    assert point.speedup == pytest.approx(point.tokens_per_s / point.alone_tokens_per_s, rel=1e-3)
    assert 0 < point.draft_busy <= 1
