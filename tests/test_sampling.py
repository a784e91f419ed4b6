"""Speculative sampling reproduces the target's distribution (statistically, fixed seeds) and greedy exactly."""

from __future__ import annotations

import itertools

import pytest
import torch

from starsd.sampling import (
    SamplingParams,
    dense_from_sparse,
    logits_to_probs,
    truncate_top_k,
    verify,
    verify_greedy,
)
from tests.stats import chi2_critical, chi2_statistic, fits

V = 6


def _random_dist(gen: torch.Generator, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(V, generator=gen) * sharp, dim=-1)


def _speculate(
    p_rows: torch.Tensor, q_rows: torch.Tensor, length: int, gamma: int, gen: torch.Generator, sampler=verify
) -> list[int]:
    """Generate ``length`` tokens from a 'model' whose position-j distribution is p_rows[j] (q_rows for the draft)."""
    out: list[int] = []
    while len(out) < length:
        start = len(out)
        g = min(gamma, length - start - 1)
        drafts = [int(torch.multinomial(q_rows[start + i], 1, generator=gen)) for i in range(g)]
        verdict = sampler(drafts, q_rows[start : start + g], p_rows[start : start + g + 1], gen)
        out.extend(verdict.tokens)
    return out[:length]


def _joint_counts(samples: list[list[int]]) -> list[int]:
    counts = {cell: 0 for cell in itertools.product(range(V), repeat=2)}
    for s in samples:
        counts[(s[0], s[1])] += 1
    return list(counts.values())


def _joint_probs(p_rows: torch.Tensor) -> list[float]:
    return [float(p_rows[0, a] * p_rows[1, b]) for a, b in itertools.product(range(V), repeat=2)]


@pytest.mark.parametrize("gamma", [1, 3])
def test_speculative_sampling_reproduces_the_target_joint_distribution(gamma: int) -> None:
    gen = torch.Generator().manual_seed(1234 + gamma)
    p_rows = torch.stack([_random_dist(gen) for _ in range(4)])
    q_rows = torch.stack([_random_dist(gen) for _ in range(4)])
    samples = [_speculate(p_rows, q_rows, 2, gamma, gen) for _ in range(20000)]
    observed = _joint_counts(samples)
    assert fits(observed, _joint_probs(p_rows)), chi2_statistic(observed, _joint_probs(p_rows))


def test_the_check_rejects_a_sampler_that_resamples_from_p_instead_of_the_residual() -> None:
    """The statistical test has power: a classic bug (resampling from p after a rejection) fails it."""

    def wrong(drafts, q, p, gen):
        from starsd.sampling import Verdict

        accepted: list[int] = []
        for i, d in enumerate(drafts):
            if torch.rand((), generator=gen) < min(1.0, float(p[i, d] / q[i, d])):
                accepted.append(d)
                continue
            return Verdict(len(accepted), [*accepted, int(torch.multinomial(p[i], 1, generator=gen))])
        return Verdict(len(drafts), [*accepted, int(torch.multinomial(p[len(drafts)], 1, generator=gen))])

    gen = torch.Generator().manual_seed(99)
    p_rows = torch.stack([_random_dist(gen) for _ in range(4)])
    q_rows = torch.stack([_random_dist(gen) for _ in range(4)])
    samples = [_speculate(p_rows, q_rows, 2, 3, gen, sampler=wrong) for _ in range(20000)]
    stat, df = chi2_statistic(_joint_counts(samples), _joint_probs(p_rows))
    assert stat > chi2_critical(df)


def test_top_k_truncated_proposals_stay_lossless() -> None:
    """The draft proposes from its top-k, renormalised, and reports it: the output is still the target's."""
    gen = torch.Generator().manual_seed(7)
    p = _random_dist(gen, sharp=1.0)
    q_full = _random_dist(gen, sharp=1.0)
    ids, q_k = truncate_top_k(q_full, 3)
    q = dense_from_sparse(ids.unsqueeze(0), q_k.unsqueeze(0), V)[0]
    assert float(q.sum()) == pytest.approx(1.0)
    assert int((q > 0).sum()) == 3
    counts = [0] * V
    for _ in range(20000):
        d = int(torch.multinomial(q, 1, generator=gen))
        verdict = verify([d], q.unsqueeze(0), torch.stack([p, p]), gen)
        counts[verdict.tokens[0]] += 1
    assert fits(counts, p.tolist())


def test_seeded_verification_is_deterministic() -> None:
    gen = torch.Generator().manual_seed(5)
    p_rows = torch.stack([_random_dist(gen) for _ in range(4)])
    q_rows = torch.stack([_random_dist(gen) for _ in range(4)])
    runs = [_speculate(p_rows, q_rows, 4, 3, torch.Generator().manual_seed(42)) for _ in range(2)]
    assert runs[0] == runs[1]


def test_greedy_accepts_the_longest_matching_prefix_then_the_target_token() -> None:
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]).tokens == [5, 6, 9]
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]).accepted == 2
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]).tokens == [5, 6, 7, 1]  # all accepted: bonus
    assert verify_greedy([5], [4, 1]).tokens == [4]  # first rejected: the target's own token
    assert verify_greedy([], [3]).tokens == [3]  # no draft: plain decoding


def test_greedy_through_the_general_verifier_matches_the_greedy_fast_path() -> None:
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(3))
    p = logits_to_probs(logits, SamplingParams(temperature=0.0))
    target = logits.argmax(-1).tolist()
    drafts = [target[0], target[1], (target[2] + 1) % V]
    assert verify(drafts, None, p).tokens == verify_greedy(drafts, target).tokens == [*target[:2], target[2]]


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


def test_verify_refuses_mismatched_shapes_and_impossible_drafts() -> None:
    p = torch.full((2, V), 1.0 / V)
    with pytest.raises(ValueError, match="gamma \\+ 1"):
        verify([1, 2], None, p)
    q = torch.zeros(1, V)
    q[0, 0] = 1.0
    with pytest.raises(ValueError, match="probability 0"):
        verify([3], q, p)


def test_the_batched_verifier_returns_the_reference_tokens_for_the_same_seeds() -> None:
    """verify_batch over ragged rows (mixed gamma, greedy and sampled) equals verify row by row, seed for seed."""
    from starsd.sampling import probs_batch, step_draws, verify_batch

    gen = torch.Generator().manual_seed(21)
    vocab, width, rows = 12, 4, 300
    params = [
        SamplingParams(temperature=0.0)
        if b % 5 == 0
        else SamplingParams(temperature=0.5 + (b % 3) * 0.4, top_p=0.9 if b % 2 else 1.0)
        for b in range(rows)
    ]
    gammas = [b % (width + 1) for b in range(rows)]
    target_logits = torch.randn(rows, width + 1, vocab, generator=gen) * 2.0
    target_probs = probs_batch(target_logits, params)
    draft_probs = torch.softmax(torch.randn(rows, width, vocab, generator=gen) * 2.0, dim=-1)
    drafts = torch.zeros(rows, width, dtype=torch.long)
    for b in range(rows):
        for i in range(gammas[b]):
            if params[b].greedy:  # a greedy draft is deterministic: one-hot q at the drafted token
                drafts[b, i] = int(torch.randint(vocab, (), generator=gen))
                draft_probs[b, i] = torch.nn.functional.one_hot(drafts[b, i], vocab).float()
            else:
                drafts[b, i] = int(torch.multinomial(draft_probs[b, i], 1, generator=gen))
    seeds = [1000 + b for b in range(rows)]
    generators = [None if p.greedy else torch.Generator().manual_seed(s) for p, s in zip(params, seeds, strict=True)]
    uniforms, races = step_draws(gammas, width, vocab, generators, torch.device("cpu"))
    batch = verify_batch(drafts, torch.tensor(gammas), draft_probs, target_probs, uniforms, races)
    for b in range(rows):
        g = gammas[b]
        row_drafts = drafts[b, :g].tolist()
        if params[b].greedy:
            expected = verify_greedy(row_drafts, target_logits[b, : g + 1].argmax(-1).tolist())
        else:
            row_gen = torch.Generator().manual_seed(seeds[b])
            expected = verify(row_drafts, draft_probs[b, :g], target_probs[b, : g + 1], row_gen)
        assert int(batch.accepted[b]) == expected.accepted, b
        assert [*row_drafts[: expected.accepted], int(batch.last[b])] == expected.tokens, b


def test_batched_probabilities_equal_the_per_row_ones() -> None:
    from starsd.sampling import probs_batch

    logits = torch.randn(6, 3, V, generator=torch.Generator().manual_seed(4)) * 3
    params = [
        SamplingParams(0.0),
        SamplingParams(1.0),
        SamplingParams(0.7, 0.8),
        SamplingParams(1e-7),
        SamplingParams(1.3, 0.5),
        SamplingParams(2.0),
    ]
    batched = probs_batch(logits, params)
    for b, p in enumerate(params):
        assert torch.allclose(batched[b], logits_to_probs(logits[b], p), atol=1e-6), b


def test_the_greedy_step_verdict_equals_the_general_one_on_one_hot_distributions() -> None:
    from starsd.sampling import probs_batch, step_draws, verify_batch
    from starsd.verifier.runner import greedy_verdict

    gen = torch.Generator().manual_seed(8)
    rows, width, vocab = 64, 4, 9
    logits = torch.randn(rows, width + 1, vocab, generator=gen)
    gammas = torch.tensor([b % (width + 1) for b in range(rows)])
    argmax = logits.argmax(-1)
    # Drafts that agree with the target for a random number of positions, then stray.
    drafts = torch.where(
        torch.rand(rows, width, generator=gen) < 0.7, argmax[:, :width], (argmax[:, :width] + 1) % vocab
    )
    greedy = [SamplingParams(temperature=0.0)] * rows
    q = torch.nn.functional.one_hot(drafts, vocab).float()
    uniforms, races = step_draws(gammas.tolist(), width, vocab, [None] * rows, torch.device("cpu"))
    general = verify_batch(drafts, gammas, q, probs_batch(logits, greedy), uniforms, races)
    accepted, last = greedy_verdict(drafts, gammas, logits)
    assert accepted.tolist() == general.accepted.tolist()
    assert last.tolist() == general.last.tolist()
    for b in range(rows):  # and the per-sequence reference
        g = int(gammas[b])
        ref = verify_greedy(drafts[b, :g].tolist(), argmax[b, : g + 1].tolist())
        assert (int(accepted[b]), int(last[b])) == (ref.accepted, ref.tokens[-1])


def test_batched_proposals_draw_what_each_row_draws_alone() -> None:
    """The draft's batched choice: every row gets the token, support and distribution :func:`draw_proposal` gives
    it from the same seed (greedy, sampled, top-p and different top-k side by side), and a row that is not live
    leaves its random stream where it was."""
    from starsd.sampling import draft_generator, draw_proposal, draw_proposals

    vocab = 40
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(9)) * 3
    params = [
        SamplingParams(1.0),
        SamplingParams(0.0),
        SamplingParams(0.7, 0.8),
        SamplingParams(1.3),
        SamplingParams(1.0),
    ]
    top_ks = [6, 8, 3, 64, 6]
    for draw in range(20):
        live = [b != 4 or draw % 2 == 0 for b in range(5)]
        batched = [draft_generator(100 * draw + b) for b in range(5)]
        alone = [draft_generator(100 * draw + b) for b in range(5)]
        tokens, ids, q = draw_proposals(logits, params, top_ks, batched, live)
        assert ids is not None and q is not None and ids.shape[1] == vocab  # the largest top-k, capped at V
        for b in range(5):
            if not live[b]:
                assert torch.equal(batched[b].get_state(), alone[b].get_state())  # nothing drawn
                continue
            d, row_ids, row_q = draw_proposal(logits[b], params[b], top_ks[b], alone[b])
            assert int(tokens[b]) == d, (draw, b)
            if row_ids is not None and row_q is not None:
                # The same distribution over the vocabulary (ids of probability 0, past top-p, may come in any order).
                k = row_ids.shape[0]
                ours = dense_from_sparse(ids[b, :k], q[b, :k], vocab)
                assert torch.allclose(ours, dense_from_sparse(row_ids, row_q, vocab), atol=1e-6), (draw, b)
                assert float(q[b, k:].sum()) == 0.0
            assert torch.equal(batched[b].get_state(), alone[b].get_state())  # the same draws were made
    greedy, none_ids, none_q = draw_proposals(logits, [SamplingParams(0.0)] * 5, top_ks, [None] * 5)
    assert greedy.tolist() == logits.argmax(-1).tolist() and none_ids is None and none_q is None
