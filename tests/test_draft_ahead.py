"""Drafting ahead: while the target verifies, the draft extends a greedy session's continuation, and a request whose
tokens it predicted gets the proposal already drafted; any other request is answered as without drafting ahead.

The proposals are compared with those of a fresh session fed the same committed text (one forward pass over the
whole text): drafting ahead may change when tokens are computed, never which ones a greedy draft proposes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from starsd.checkpoints import LoadedModel, load_checkpoint
from starsd.draft.runner import DraftRunner
from starsd.proposals import DraftRequest
from starsd.sampling import SamplingParams
from starsd.verifier.runner import StepRow, TargetRunner
from tests.support.reference import autoregressive_reference

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, seed=3)
PROMPT = [5, 17, 42, 7, 99, 3, 250]
GAMMA = 4


@pytest.fixture(scope="module")
def draft(shipped_pair: tuple[Path, Path]) -> LoadedModel:
    return load_checkpoint(shipped_pair[0])


def fresh(draft: LoadedModel, committed: list[int], gamma: int = GAMMA) -> list[int]:
    """What a session that has seen nothing yet proposes after ``committed``."""
    runner = DraftRunner(draft, ahead="off")
    return runner.propose(runner.new_state(None), committed, gamma, GREEDY, 8).token_ids


def never() -> bool:
    return False


def test_a_fully_predicted_round_is_answered_from_what_was_drafted_ahead(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    state = runner.new_state(None)
    first = runner.propose(state, PROMPT, GAMMA, GREEDY, 8)
    assert first.ahead == 0 and first.token_ids == fresh(draft, PROMPT)
    passes = runner.draft_ahead(never)
    assert passes == GAMMA + 1  # the expected next token of the target, then a whole next proposal
    expected_next = state.chain[GAMMA]
    committed = PROMPT + first.token_ids + [expected_next]  # every proposal accepted, the expected token added

    second = runner.propose(state, [*first.token_ids, expected_next], GAMMA, GREEDY, 8)
    assert second.ahead == GAMMA
    assert second.token_ids == fresh(draft, committed)


def test_a_rejection_drops_the_chain_and_drafts_as_without_it(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    state = runner.new_state(None)
    first = runner.propose(state, PROMPT, GAMMA, GREEDY, 8)
    runner.draft_ahead(never)
    correction = (first.token_ids[2] + 1) % draft.vocab_size  # the target rejects the third proposal
    new = [*first.token_ids[:2], correction]
    second = runner.propose(state, new, GAMMA, GREEDY, 8)
    assert second.ahead == 0
    assert second.token_ids == fresh(draft, PROMPT + new)
    assert state.cached == (PROMPT + new + second.token_ids)[:-1]


def test_a_target_token_other_than_the_expected_one_is_a_miss(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    state = runner.new_state(None)
    first = runner.propose(state, PROMPT, GAMMA, GREEDY, 8)
    runner.draft_ahead(never)
    other = (state.chain[GAMMA] + 1) % draft.vocab_size
    new = [*first.token_ids, other]
    second = runner.propose(state, new, GAMMA, GREEDY, 8)
    assert second.ahead == 0
    assert second.token_ids == fresh(draft, PROMPT + new)


def test_drafting_ahead_stopped_early_keeps_what_it_drafted(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    state = runner.new_state(None)
    first = runner.propose(state, PROMPT, GAMMA, GREEDY, 8)
    calls = iter([False, False, True])  # asked before the first pass and after each: two passes, then a request
    passes = runner.draft_ahead(lambda: next(calls, True))
    assert passes == 2 and len(state.chain) == GAMMA + 2
    new = [*first.token_ids, state.chain[GAMMA]]
    second = runner.propose(state, new, GAMMA, GREEDY, 8)
    assert second.ahead == 1  # one token was ready, the other three drafted on request
    assert second.token_ids == fresh(draft, PROMPT + new)


def test_nothing_is_drafted_ahead_when_a_request_already_waits(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    state = runner.new_state(None)
    runner.propose(state, PROMPT, GAMMA, GREEDY, 8)
    assert runner.draft_ahead(lambda: True) == 0
    assert len(state.chain) == GAMMA


def test_sampled_sessions_and_a_runner_without_it_draft_nothing_ahead(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    runner.propose(runner.new_state(11), PROMPT, GAMMA, SAMPLED, 8)
    assert runner.draft_ahead(never) == 0
    off = DraftRunner(draft, ahead="off")
    off.propose(off.new_state(None), PROMPT, GAMMA, GREEDY, 8)
    assert off.draft_ahead(never) == 0


def test_a_batch_drafts_ahead_together_and_each_session_keeps_its_own_chain(draft: LoadedModel) -> None:
    runner = DraftRunner(draft, ahead="on")
    prompts = [PROMPT, [9, 8, 7, 6], [300, 301]]
    states = [runner.new_state(None) for _ in prompts]
    firsts = runner.propose_batch([DraftRequest(s, p, GAMMA, GREEDY, 8) for s, p in zip(states, prompts, strict=True)])
    assert runner.draft_ahead(never) == GAMMA + 1
    news = [[*f.token_ids, s.chain[GAMMA]] for f, s in zip(firsts, states, strict=True)]
    seconds = runner.propose_batch([DraftRequest(s, n, GAMMA, GREEDY, 8) for s, n in zip(states, news, strict=True)])
    for p, n, second in zip(prompts, news, seconds, strict=True):
        assert second.ahead == GAMMA
        assert second.token_ids == fresh(draft, p + n)


def test_speculating_with_the_target_as_its_own_draft_hits_every_round(shipped_pair: tuple[Path, Path]) -> None:
    """A draft that is the target predicts every round whole: after the first, every proposal was drafted
    ahead, and the output is still plain greedy decoding."""
    target = load_checkpoint(shipped_pair[1])
    reference = autoregressive_reference(target, PROMPT, 24)
    runner, proposer = TargetRunner(target), DraftRunner(target, ahead="on")
    session = runner.new_session(PROMPT)
    state = proposer.new_state(None)
    out: list[int] = []
    new = list(PROMPT)
    ahead: list[int] = []
    while len(out) < 24:
        proposal = proposer.propose(state, new, 3, GREEDY, 8)
        ahead.append(proposal.ahead)
        proposer.draft_ahead(never)  # the target verifies meanwhile
        (verdict,) = runner.step([StepRow(session, proposal.token_ids, GREEDY)])
        out.extend(verdict.tokens)
        new = verdict.tokens
    assert out[:24] == reference[:24]
    assert ahead[0] == 0 and all(a == 3 for a in ahead[1:])


def test_auto_drafts_ahead_only_with_an_accelerator_of_its_own() -> None:
    import torch

    from starsd.draft.runner import ahead_enabled

    assert ahead_enabled("auto", torch.device("cuda", 0)) and not ahead_enabled("auto", torch.device("cpu"))
    assert ahead_enabled("on", torch.device("cpu")) and not ahead_enabled("off", torch.device("cuda", 0))
    with pytest.raises(ValueError, match="--draft-ahead must be one of auto, on, off"):
        ahead_enabled("sometimes", torch.device("cpu"))


def test_the_runner_says_how_it_drafts(draft: LoadedModel) -> None:
    """The draft's start-up line carries this: a user who sets --draft-ahead sees whether it took effect."""
    assert DraftRunner(draft).describe() == "lean passes, drafting ahead off"  # auto on a CPU
    assert DraftRunner(draft, ahead="on", lean=False).describe() == "the model's own passes, drafting ahead on"
