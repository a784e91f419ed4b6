"""The proposal codec both sides share: what the draft encodes, the target decodes unchanged; what cannot be
verified is refused by name; greedy answers carry ids only."""

from __future__ import annotations

import pytest

from starsd import proposal_codec as codec
from starsd.proposals import Proposal
from starsd.proto import starsd_pb2 as pb


def test_a_proposal_survives_the_wire_padding_and_all() -> None:
    # Position 2's support is shorter: it travels padded to top_k = 3 and comes back as it was.
    proposal = Proposal([4, 9], q_ids=[[4, 5, 6], [9, 1]], q_probs=[[0.5, 0.25, 0.25], [0.75, 0.25]])
    response = codec.encode(proposal, pb.ProposeResponse(session_id=7, seq=2))
    assert response.top_k == 3 and list(response.q_ids) == [4, 5, 6, 9, 1, codec.PAD_ID]
    assert list(response.q_probs)[-1] == 0.0 and response.session_id == 7
    wire = pb.ProposeResponse.FromString(response.SerializeToString())
    assert codec.decode(wire, gamma=2, vocab_size=10, sampled=True) == proposal


def test_a_greedy_answer_decodes_to_its_ids_only() -> None:
    response = codec.encode(Proposal([3, 1, 2]), pb.ProposeResponse())
    assert response.top_k == 0 and not response.q_ids
    assert codec.decode(response, gamma=3, vocab_size=10, sampled=False) == Proposal([3, 1, 2])


@pytest.mark.parametrize(
    ("proposal", "gamma", "fault"),
    [
        (Proposal([1, 2, 3]), 2, "asked for"),
        (Proposal([1, 12]), 2, "outside"),
        (Proposal([1], [[2, 3]], [[0.5, 0.5]]), 1, "no probability"),
        (Proposal([1], [[1, 2]], [[0.7, 0.7]]), 1, "not a probability"),
    ],
)
def test_an_answer_that_cannot_be_verified_is_refused_by_name(proposal: Proposal, gamma: int, fault: str) -> None:
    response = codec.encode(proposal, pb.ProposeResponse())
    with pytest.raises(codec.MalformedProposal, match=fault):
        codec.decode(response, gamma=gamma, vocab_size=10, sampled=True)
