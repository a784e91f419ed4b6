"""Model runners keep their KV caches consistent: crop-and-resume equals computing from scratch.

The tests taking ``any_pair`` run on the tiny pair and on its grouped-query twin (fewer key/value heads).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from starsd.checkpoints import ModelLoadError, check_same_vocabulary, load_checkpoint
from starsd.draft.runner import DraftRunner
from starsd.sampling import SamplingParams
from starsd.verifier.runner import StepRow, TargetRunner
from tests.support.reference import autoregressive_reference

GREEDY = SamplingParams(temperature=0.0)


def test_a_wrong_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_checkpoint(tmp_path / "empty")


def test_a_pair_with_different_vocabularies_is_refused(mismatched_pair: tuple[Path, Path]) -> None:
    draft, target = (load_checkpoint(p) for p in mismatched_pair)
    with pytest.raises(ModelLoadError, match="do not share a vocabulary"):
        check_same_vocabulary(draft, target)


def test_the_random_pair_shares_one_vocabulary(random_pair: tuple[Path, Path]) -> None:
    draft, target = (load_checkpoint(p) for p in random_pair)
    assert draft.fingerprint == target.fingerprint and draft.vocab_size == target.vocab_size
    check_same_vocabulary(draft, target)  # accepted: no error


def test_target_verification_rounds_reproduce_plain_greedy_decoding(any_pair: tuple[Path, Path]) -> None:
    """Speculating with a draft that is the target itself accepts everything and equals generate()."""
    target = load_checkpoint(any_pair[1])
    prompt = [5, 17, 42, 7, 99]
    reference = autoregressive_reference(target, prompt, 20)
    runner, proposer = TargetRunner(target), DraftRunner(target)
    session = runner.new_session(prompt)
    state = proposer.new_state(None)
    out: list[int] = []
    new = list(prompt)
    while len(out) < 20:
        drafts = proposer.propose(state, new, 3, GREEDY, 8).token_ids
        (verdict,) = runner.step([StepRow(session, drafts, GREEDY)])
        out.extend(verdict.tokens)
        new = verdict.tokens
        assert verdict.accepted == len(drafts)
    assert out[:20] == reference[:20]


def test_rejected_drafts_are_cropped_from_both_caches(any_pair: tuple[Path, Path]) -> None:
    """Deliberately wrong drafts: after each rejection both caches must still give the true continuation."""
    draft, target = (load_checkpoint(p) for p in any_pair)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reference = autoregressive_reference(target, prompt, 16)
    runner, proposer = TargetRunner(target), DraftRunner(draft)
    session = runner.new_session(prompt)
    state = proposer.new_state(None)
    out: list[int] = []
    new = list(prompt)
    while len(out) < 16:
        drafts = proposer.propose(state, new, 4, GREEDY, 8).token_ids
        drafts = [(d + 1) % target.vocab_size for d in drafts]  # force rejections
        (verdict,) = runner.step([StepRow(session, drafts, GREEDY)])
        out.extend(verdict.tokens)
        new = verdict.tokens
    assert out[:16] == reference[:16]
    # The draft's own cache agrees with a fresh draft session fed the same committed text.
    fresh = proposer.new_state(None)
    again = proposer.propose(fresh, list(session.committed), 4, GREEDY, 8).token_ids
    assert proposer.propose(state, new, 4, GREEDY, 8).token_ids == again


def test_sampled_proposals_report_the_distribution_they_were_drawn_from(any_pair: tuple[Path, Path]) -> None:
    draft = load_checkpoint(any_pair[0])
    proposer = DraftRunner(draft)
    state = proposer.new_state(seed=11)
    proposal = proposer.propose(state, [1, 2, 3], 4, SamplingParams(temperature=1.0), top_k=5)
    assert len(proposal.token_ids) == 4
    for d, ids, probs in zip(proposal.token_ids, proposal.q_ids, proposal.q_probs, strict=True):
        assert d in ids and len(ids) == 5
        assert sum(probs) == pytest.approx(1.0, abs=1e-5)
        assert probs[ids.index(d)] > 0
    again = proposer.propose(proposer.new_state(seed=11), [1, 2, 3], 4, SamplingParams(temperature=1.0), top_k=5)
    assert again.token_ids == proposal.token_ids  # seeded: reproducible


def test_the_draft_never_proposes_past_its_context(random_pair: tuple[Path, Path]) -> None:
    draft = load_checkpoint(random_pair[0])
    proposer = DraftRunner(draft)
    state = proposer.new_state(None)
    near_end = [1] * (draft.max_context - 2)
    with torch.inference_mode():
        assert len(proposer.propose(state, near_end, 8, GREEDY, 8).token_ids) == 2


def test_batched_drafting_matches_drafting_one_session_at_a_time(any_pair: tuple[Path, Path]) -> None:
    """Padding and masks keep sessions apart: same tokens and the same proposal distributions."""
    from starsd.proposals import DraftRequest

    draft = load_checkpoint(any_pair[0])
    proposer = DraftRunner(draft)
    params = SamplingParams(temperature=1.0)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17], [1]]
    gammas = [4, 2, 3, 4]
    alone = [proposer.new_state(seed=i) for i in range(4)]
    batched = [proposer.new_state(seed=i) for i in range(4)]
    gen = torch.Generator().manual_seed(0)
    new = prompts
    for _ in range(4):
        one = [proposer.propose(s, t, g, params, 6) for s, t, g in zip(alone, new, gammas, strict=True)]
        many = proposer.propose_batch(
            [DraftRequest(s, t, g, params, 6) for s, t, g in zip(batched, new, gammas, strict=True)]
        )
        for a, b in zip(one, many, strict=True):
            assert a.token_ids == b.token_ids
            assert a.q_ids == b.q_ids
            assert torch.allclose(torch.tensor(a.q_probs), torch.tensor(b.q_probs), atol=1e-4)
        # The targets accept a random prefix and add a token of their own: caches must crop correctly.
        new = []
        for a in one:
            keep = int(torch.randint(0, len(a.token_ids) + 1, (), generator=gen))
            new.append([*a.token_ids[:keep], int(torch.randint(0, draft.vocab_size, (), generator=gen))])
    assert [s.committed for s in alone] == [s.committed for s in batched]


def test_a_batch_mixes_new_sessions_with_long_cached_ones(any_pair: tuple[Path, Path]) -> None:
    """New sessions (no cache yet), long ones (caches past their first growth) and gamma 1 share one batch."""
    from starsd.proposals import DraftRequest

    draft = load_checkpoint(any_pair[0])
    proposer = DraftRunner(draft)
    rng = torch.Generator().manual_seed(1)

    def tokens(n: int) -> list[int]:
        return [int(t) for t in torch.randint(0, draft.vocab_size, (n,), generator=rng)]

    alone = [proposer.new_state(seed=None) for _ in range(3)]
    batched = [proposer.new_state(seed=None) for _ in range(3)]
    history = tokens(150)  # longer than a slab's first capacity: its buffer has grown
    for a, b in zip(alone[:2], batched[:2], strict=True):
        proposer.propose(a, history, 3, GREEDY, 8)
        proposer.propose(b, history, 3, GREEDY, 8)
    new = [tokens(1), tokens(5), tokens(9)]  # the third session is new: its first request is its prompt
    for gammas in ([1, 4, 2], [3, 1, 4], [4, 4, 1]):
        one = [proposer.propose(s, t, g, GREEDY, 8) for s, t, g in zip(alone, new, gammas, strict=True)]
        many = proposer.propose_batch(
            [DraftRequest(s, t, g, GREEDY, 8) for s, t, g in zip(batched, new, gammas, strict=True)]
        )
        assert [p.token_ids for p in one] == [p.token_ids for p in many]
        new = [[*p.token_ids[:1], *tokens(1)] for p in one]
    # Afterwards each session drafts alone from the cache the batch handed back.
    for a, b in zip(alone, batched, strict=True):
        assert proposer.propose(a, [7], 4, GREEDY, 8).token_ids == proposer.propose(b, [7], 4, GREEDY, 8).token_ids


def test_a_batched_step_of_ragged_sessions_matches_each_session_alone(any_pair: tuple[Path, Path]) -> None:
    """Sessions of different lengths, prefill chunks, decodes and wrong drafts in one step: greedy output is
    each prompt's plain greedy decoding, whatever else shares the step."""
    draft, target = (load_checkpoint(p) for p in any_pair)
    prompts = [[5, 17, 42], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9], [7], list(range(10, 60))]
    references = [autoregressive_reference(target, p, 12) for p in prompts]
    runner, proposer = TargetRunner(target), DraftRunner(draft)
    sessions = [runner.new_session(p) for p in prompts]
    states = [proposer.new_state(None) for _ in prompts]
    news = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    # The longest prompt first goes in two prefill chunks (alone, then beside the others' first rounds).
    runner.step([StepRow(sessions[3], prefill=20)])
    for step in range(14):
        rows = []
        for i, s in enumerate(sessions):
            if len(outs[i]) >= 12:
                continue
            if i == 3 and step == 0:
                rows.append(StepRow(s, prefill=20))
                continue
            drafts = proposer.propose(states[i], news[i], 1 + (i + step) % 4, GREEDY, 8).token_ids
            if (i + step) % 3 == 0:
                drafts = [(d + 1) % target.vocab_size for d in drafts]
            rows.append(StepRow(s, drafts, GREEDY))
            news[i] = []
        for row, outcome in zip(rows, runner.step(rows), strict=True):
            i = sessions.index(row.session)
            if row.verify:
                outs[i].extend(outcome.tokens)
                news[i] = outcome.tokens
    for out, reference in zip(outs, references, strict=True):
        assert out[:12] == reference[:12]


def test_sessions_that_join_and_leave_a_bounded_pool_keep_their_greedy_output(random_pair: tuple[Path, Path]) -> None:
    """Sessions start and finish at different steps, so slots are freed, reused and compacted (rows renumbered)
    in a pool held to 4 slots of 64 tokens; every session still decodes exactly its prompt's greedy output."""
    target = load_checkpoint(random_pair[1])
    prompts = [[5, 17, 42], list(range(10, 40)), [7], [3, 1, 4, 1, 5], list(range(100, 120)), [9, 9]]
    lengths = [6, 10, 14, 8, 12, 5]
    references = [autoregressive_reference(target, p, n) for p, n in zip(prompts, lengths, strict=True)]
    runner = TargetRunner(target, kv_tokens=4 * 64)
    starts = [0, 0, 1, 3, 6, 9]  # the step at which each session arrives
    sessions = {}
    outs: dict[int, list[int]] = {}
    for step in range(40):
        for i, start in enumerate(starts):
            if start == step:
                sessions[i], outs[i] = runner.new_session(prompts[i]), []
        rows = [StepRow(s, [], GREEDY) for s in sessions.values()]
        for (i, session), outcome in zip(list(sessions.items()), runner.step(rows), strict=True):
            outs[i].extend(outcome.tokens)
            if len(outs[i]) >= lengths[i]:
                runner.release(session)
                del sessions[i]
        assert runner.pool.slots * runner.pool.capacity <= 4 * 64
    assert not sessions and runner.pool.used == 0
    for i, reference in enumerate(references):
        assert outs[i][: lengths[i]] == reference


def test_a_step_over_shuffled_slots_gives_the_tokens_of_consecutive_ones(any_pair: tuple[Path, Path]) -> None:
    """The same sessions, once in consecutive slots stepped in slot order, once in slots with holes between them
    stepped in a shuffled order: every step's verdicts are the same (the rows are indexed, not assumed), and
    both follow plain greedy decoding."""
    target = load_checkpoint(any_pair[1])
    rng = torch.Generator().manual_seed(5)
    prompts = [[int(t) for t in torch.randint(0, target.vocab_size, (n,), generator=rng)] for n in (3, 9, 5, 12, 7, 4)]
    references = [autoregressive_reference(target, p, 40) for p in prompts]
    consecutive, scattered = TargetRunner(target), TargetRunner(target)
    in_order = [consecutive.new_session(p) for p in prompts]
    spread = [scattered.new_session(p) for p in prompts]
    holes = [scattered.new_session([1]) for _ in prompts]
    for hole, session in zip(holes, spread, strict=True):  # slots: hole, session, hole, session, ...
        scattered.step([StepRow(hole, [], GREEDY)])
        scattered.step([StepRow(session, prefill=1)])
    for hole in holes:
        scattered.release(hole)
    consecutive.step([StepRow(s, prefill=1) for s in in_order])
    rows = scattered.pool.rows_of([s.slot for s in spread])
    assert rows != list(range(rows[0], rows[0] + len(rows)))  # the slots really have holes between them
    order = [4, 1, 5, 0, 3, 2]
    for step in range(6):
        drafts = {}
        for i, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
            done = len(in_order[i].committed) - len(prompt)
            drafts[i] = reference[done : done + 1 + (i + step) % 3]  # the true continuation ...
            if (i + step) % 2:
                drafts[i][-1] = (drafts[i][-1] + 1) % target.vocab_size  # ... or one that goes wrong at its end
        a = consecutive.step([StepRow(in_order[i], drafts[i], GREEDY) for i in range(len(prompts))])
        b = scattered.step([StepRow(spread[i], drafts[i], GREEDY) for i in order])
        outcomes = {i: (out.accepted, out.tokens) for i, out in enumerate(a)}
        assert outcomes == {i: (out.accepted, out.tokens) for i, out in zip(order, b, strict=True)}
        assert any(accepted for accepted, _ in outcomes.values())
    for session, spread_session, prompt, reference in zip(in_order, spread, prompts, references, strict=True):
        assert session.committed == spread_session.committed
        generated = session.committed[len(prompt) :]
        assert generated == reference[: len(generated)]


def test_the_draft_compares_only_its_last_proposals_with_the_new_tokens() -> None:
    from starsd.draft.runner import agreed_prefix

    assert agreed_prefix([1, 2, 3, 7, 8], 3, [7, 9, 4]) == 4  # one proposal accepted, the next rejected
    assert agreed_prefix([1, 2, 3, 7, 8], 3, [7, 8, 4]) == 5  # both accepted, then the target's own token
    assert agreed_prefix([1, 2, 3, 7, 8], 3, [5]) == 3  # the first proposal rejected
    assert agreed_prefix([1, 2], 3, [6]) == 2  # less cached than committed: all of it agrees
    assert agreed_prefix([], 0, [4, 5]) == 0
