"""The pure pieces at a round's edges: what counts after an EOS or a stop, which draft answers are verified,
and the draw that both sides use."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from starsd.draft.runner import DraftRunner
from starsd.proposal_codec import proposal_fault
from starsd.proto import starsd_pb2 as pb
from starsd.sampling import Verdict, draft_generator, sample, target_generator
from starsd.verifier.engine import RoundEnd, kept_counts
from tests.stats import fits
from tests.support.stops import stop_check


def test_drafts_past_an_eos_or_a_stop_count_neither_as_drafted_nor_accepted() -> None:
    verdict = Verdict(accepted=3, tokens=[7, 8, 9, 4])  # 4 drafted, 3 accepted, one target token
    assert kept_counts(verdict, drafted=4, keep=4) == (4, 3)  # all of it counts
    assert kept_counts(verdict, drafted=4, keep=2) == (2, 2)  # EOS (or a stop) was the 2nd accepted draft
    rejected = Verdict(accepted=1, tokens=[7, 5])
    assert kept_counts(rejected, drafted=4, keep=2) == (4, 1)  # the cut is the target's own token: all counted
    assert kept_counts(rejected, drafted=4, keep=1) == (1, 1)


def test_the_stop_check_keeps_the_tokens_through_the_one_that_completes_the_stop() -> None:
    pieces = {1: "ab", 2: "c)", 3: " 2", 4: ")x", 5: "yz"}

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids)

    check = stop_check(decode, [" 2)"])
    assert check([1], [2, 5]) is None  # no stop in "abc)yz"
    assert check([1, 2], [3, 4, 5]) == 2  # " 2" + ")x" completes " 2)": two tokens of the round
    assert check([], [1, 2, 3, 4]) == 4
    assert stop_check(decode, ["zz", "c)"])([1], [2, 3]) == 1


def _response(
    token_ids: list[int], q_ids: list[int] = (), q_probs: list[float] = (), top_k: int = 0
) -> pb.ProposeResponse:  # type: ignore[assignment]
    return pb.ProposeResponse(token_ids=token_ids, q_ids=list(q_ids), q_probs=list(q_probs), top_k=top_k)


@pytest.mark.parametrize(
    ("response", "gamma", "sampled", "fault"),
    [
        (_response([1, 2]), 2, False, None),
        (_response([1, 2, 3]), 2, False, "asked for"),
        (_response([1, 100]), 2, False, "outside"),
        (_response([1, 2]), 2, True, "top_k"),  # sampled, yet no distribution
        (_response([1], [1, 2], [0.5, 0.5], 2), 1, True, None),
        (_response([1], [1, -1], [1.0, 0.0], 2), 1, True, None),  # padded support
        (_response([3], [1, 2], [0.5, 0.5], 2), 1, True, "no probability"),  # drawn from outside its support
        (_response([1], [1, 2], [1.0, 0.0], 2), 1, True, None),
        (_response([2], [1, 2], [1.0, 0.0], 2), 1, True, "no probability"),
        (_response([1], [1, 2], [0.7, 0.7], 2), 1, True, "not a probability"),
        (_response([1], [1, 2], [float("nan"), 1.0], 2), 1, True, "not a probability"),
        (_response([1], [1, 1], [0.5, 0.5], 2), 1, True, "twice"),
        (_response([1], [1, -1], [0.5, 0.5], 2), 1, True, "padding"),
        (_response([1], [1, 200], [0.5, 0.5], 2), 1, True, "outside the vocabulary"),
    ],
)
def test_a_draft_answer_is_verified_only_if_well_formed(
    response: pb.ProposeResponse, gamma: int, sampled: bool, fault: str | None
) -> None:
    found = proposal_fault(response, gamma, vocab_size=100, sampled=sampled)
    if fault is None:
        assert found is None
    else:
        assert found is not None and fault in found


def test_the_draw_follows_its_distribution_and_never_picks_an_impossible_token() -> None:
    probs = torch.tensor([0.5, 0.0, 0.2, 0.05, 0.25, 0.0])
    gen = torch.Generator().manual_seed(11)
    counts = [0] * len(probs)
    for _ in range(20_000):
        counts[sample(probs, gen)] += 1
    assert counts[1] == counts[5] == 0
    assert fits([counts[i] for i in (0, 2, 3, 4)], [0.5, 0.2, 0.05, 0.25])


def test_the_draft_runner_seeds_its_sessions_with_the_draft_stream() -> None:
    runner = DraftRunner(SimpleNamespace(device=torch.device("cpu")), lean=False)  # type: ignore[arg-type]
    state = runner.new_state(1234)
    probs = torch.full((1000,), 1e-3)
    draws = [sample(probs, state.generator) for _ in range(5)]
    expected = draft_generator(1234)
    assert draws == [sample(probs, expected) for _ in range(5)]
    target = target_generator(1234)
    assert draws != [sample(probs, target) for _ in range(5)]


def test_each_request_on_the_stream_says_how_many_of_its_burst_follow() -> None:
    """A step's sessions ask the draft together; each request carries the count still queued behind it."""
    from starsd.verifier.draft_stream import requests

    async def sent() -> list[tuple[int, int]]:
        queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()
        for i in range(1, 4):
            queue.put_nowait(pb.ProposeRequest(target_id="t", session_id=i, seq=1))
        out = []
        stream = requests(queue)
        for _ in range(3):
            req = await anext(stream)
            out.append((req.session_id, req.following))
        queue.put_nowait(pb.ProposeRequest(target_id="t", session_id=9, seq=2))  # a later, lone request
        req = await anext(stream)
        out.append((req.session_id, req.following))
        return out

    assert asyncio.run(sent()) == [(1, 2), (2, 1), (3, 0), (9, 0)]


def test_a_round_keeps_its_tokens_up_to_an_end_token_or_a_stop() -> None:
    from starsd.verifier.engine import round_outcome

    assert round_outcome([7, 8, 9], ends=(2,), stop=None) == RoundEnd([7, 8, 9], keep=3, stopped=False)
    assert round_outcome([7, 2, 9], ends=(2,), stop=None) == RoundEnd([7], keep=2, stopped=True)  # EOS excluded
    assert round_outcome([2], ends=(2,), stop=lambda tokens: 0) == RoundEnd([], keep=1, stopped=True)
    stop_after_8 = lambda tokens: tokens.index(8) + 1 if 8 in tokens else None  # noqa: E731
    assert round_outcome([7, 8, 9], ends=(), stop=stop_after_8) == RoundEnd([7, 8], keep=2, stopped=True)
    assert round_outcome([7, 8, 2], ends=(2,), stop=stop_after_8) == RoundEnd([7, 8], keep=2, stopped=True)


def test_a_round_counts_its_kept_drafts_and_its_fallback_tokens() -> None:
    from starsd.verifier.engine import RoundStats, round_stats

    verdict = Verdict(accepted=3, tokens=[7, 8, 9, 4])
    assert round_stats(verdict, 4, RoundEnd([7], keep=2, stopped=True), fell_back=False) == RoundStats(2, 2, 0, 1)
    alone = Verdict(accepted=0, tokens=[5])
    assert round_stats(alone, 0, RoundEnd([5], keep=1, stopped=False), fell_back=True) == RoundStats(0, 0, 1, 1)
    assert round_stats(alone, 0, RoundEnd([5], keep=1, stopped=False), fell_back=False) == RoundStats(0, 0, 0, 1)
