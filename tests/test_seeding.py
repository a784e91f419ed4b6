"""The draft's and the target's random streams are independent, so seeded sampling stays lossless.

These tests run the servers' own seeding path: the target's generator from :func:`target_generator`, the draft's
from :func:`draft_generator` (what ``DraftRunner.new_state`` uses), the draft's draw through
:func:`draw_proposal` (what the draft's runner calls), and the target's verdict through :func:`verify_batch` on
the densified proposals with each row's draws from :func:`step_draws`, as the target's engine does, one fresh
pair of generators per request seed.

Power: with ``SEEDS`` = 200,000 per pair, a 5 % relative bias on a token of probability 0.05 moves its count
by 500, 5.1 standard deviations; the check fails at 4 (any token, any pair), so it catches such a bias with
probability about 0.87, and larger tokens or biases with more.
"""

from __future__ import annotations

import math

import pytest
import torch

from starsd import sampling
from starsd.sampling import (
    SamplingParams,
    dense_from_sparse,
    draft_generator,
    draw_proposal,
    logits_to_probs,
    step_draws,
    target_generator,
    verify_batch,
)
from starsd.seeding import SEED_BITS, draft_seed, request_seed
from tests.stats import chi2_critical, chi2_statistic

SEEDS = 200_000
MAX_Z = 4.0
CHUNK = 4096  # requests verified in one batched step

# (target p, draft q, temperature, top_k): the strongly disagreeing pair, a draft that piles its mass
# on the target's least likely tokens, and a milder pair under temperature and top-k truncation.
PAIRS = [
    ([0.10, 0.30, 0.05, 0.15, 0.10, 0.10, 0.10, 0.10], [0.40, 0.05, 0.25, 0.05, 0.10, 0.05, 0.05, 0.05], 1.0, 8),
    ([0.05, 0.05, 0.30, 0.20, 0.10, 0.10, 0.10, 0.10], [0.45, 0.35, 0.02, 0.02, 0.04, 0.04, 0.04, 0.04], 1.0, 8),
    ([0.12, 0.18, 0.20, 0.10, 0.15, 0.10, 0.07, 0.08], [0.20, 0.10, 0.25, 0.05, 0.15, 0.10, 0.05, 0.10], 0.7, 4),
]


def first_tokens(p: list[float], q: list[float], temperature: float, top_k: int, seeds: range) -> list[int]:
    """The first committed token of one gamma = 1 round per request seed, through the servers' seeding path:
    the draft draws with its own generator, the target verifies every request of a chunk in one batched step."""
    params = SamplingParams(temperature=temperature)
    vocab = len(p)
    target_probs = logits_to_probs(torch.tensor([p, p]).log(), params)  # [gamma + 1, V]
    draft_logits = torch.tensor(q).log()
    counts = [0] * vocab
    for start in range(seeds.start, seeds.stop, CHUNK):
        chunk = range(start, min(start + CHUNK, seeds.stop))
        drafts, supports, q_probs = [], [], []
        for seed in chunk:
            d, ids, qk = draw_proposal(draft_logits, params, top_k, draft_generator(seed))
            assert ids is not None and qk is not None
            drafts.append([d])
            supports.append(ids)
            q_probs.append(qk)
        dense = dense_from_sparse(torch.stack(supports), torch.stack(q_probs), vocab).unsqueeze(1)  # [B, 1, V]
        gammas = [1] * len(chunk)
        uniforms, races = step_draws(gammas, 1, vocab, [target_generator(s) for s in chunk], torch.device("cpu"))
        verdict = verify_batch(
            torch.tensor(drafts),
            torch.tensor(gammas),
            dense,
            target_probs.expand(len(chunk), -1, -1),
            uniforms,
            races,
        )
        first = torch.where(verdict.accepted > 0, torch.tensor(drafts)[:, 0], verdict.last)
        for token, n in enumerate(torch.bincount(first, minlength=vocab).tolist()):
            counts[token] += n
    return counts


def deviations(counts: list[int], probs: list[float]) -> list[float]:
    """Each token's count against its expectation, in standard deviations (binomial)."""
    n = sum(counts)
    return [(c - n * p) / math.sqrt(n * p * (1 - p)) for c, p in zip(counts, probs, strict=True)]


def expected(p: list[float], temperature: float) -> list[float]:
    return logits_to_probs(torch.tensor(p).log(), SamplingParams(temperature=temperature)).tolist()


@pytest.mark.parametrize(("p", "q", "temperature", "top_k"), PAIRS)
def test_seeded_speculative_sampling_follows_the_target_distribution(
    p: list[float], q: list[float], temperature: float, top_k: int
) -> None:
    counts = first_tokens(p, q, temperature, top_k, range(SEEDS))
    target = expected(p, temperature)
    z = deviations(counts, target)
    stat, df = chi2_statistic(counts, target)
    assert max(abs(v) for v in z) < MAX_Z, f"z per token {[round(v, 1) for v in z]}, chi-square {stat:.1f} ({df} df)"
    assert stat < chi2_critical(df), f"chi-square {stat:.1f} ({df} df)"


def test_the_check_sees_a_draft_that_shares_the_target_random_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug this file guards against: both generators seeded with the request seed. The check must fail it."""
    monkeypatch.setattr(sampling, "draft_seed", lambda seed: seed)
    p, q, temperature, top_k = PAIRS[0]
    counts = first_tokens(p, q, temperature, top_k, range(SEEDS // 4))  # a quarter of the seeds is enough
    stat, df = chi2_statistic(counts, expected(p, temperature))
    assert max(abs(v) for v in deviations(counts, expected(p, temperature))) > MAX_Z
    assert stat > chi2_critical(df), stat


def test_the_draft_seed_is_derived_never_the_request_seed() -> None:
    seeds = [0, 1, 2, 42, 2**SEED_BITS - 1, *range(1000, 1100)]
    derived = [draft_seed(s) for s in seeds]
    assert all(d != s for d, s in zip(derived, seeds, strict=True))
    assert all(0 <= d < 2**SEED_BITS for d in derived)
    assert len(set(derived)) == len(derived)
    assert [draft_seed(s) for s in seeds] == derived  # a function of the seed: seeded requests reproduce


def test_seed_zero_is_a_seed_and_an_unseeded_request_draws_a_fresh_one() -> None:
    assert request_seed(0) == 0
    fresh = {request_seed(None) for _ in range(20)}
    assert len(fresh) == 20 and all(0 <= s < 2**SEED_BITS for s in fresh)


def test_one_seed_gives_one_draw_on_each_side() -> None:
    probs = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert sampling.sample(probs, target_generator(7)) == sampling.sample(probs, target_generator(7))
    assert sampling.sample(probs, draft_generator(7)) == sampling.sample(probs, draft_generator(7))
