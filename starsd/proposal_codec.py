"""A proposal's wire form, in one place for both sides: the draft encodes, the target checks and decodes.

A :class:`starsd.proposals.Proposal` travels in a ``ProposeResponse`` (see ``starsd/proto/starsd.proto``): the
ids ``d_1..d_gamma`` in ``token_ids`` and, for sampled proposals, each position's top-k support and
probabilities flattened into ``q_ids`` / ``q_probs``, ``top_k`` entries per position, a shorter support padded
with id :data:`PAD_ID` and probability 0. ``decode(encode(p))`` gives ``p`` back.
"""

from __future__ import annotations

import math

from starsd.proposals import Proposal
from starsd.proto import starsd_pb2 as pb

PAD_ID = -1  # fills a position's support up to top_k entries; carries probability 0


class MalformedProposal(ValueError):
    """A draft's answer that cannot be verified (the round decodes alone)."""


def encode(proposal: Proposal, response: pb.ProposeResponse) -> pb.ProposeResponse:
    """Write ``proposal`` into ``response`` (its header fields are the caller's); returns ``response``."""
    response.token_ids.extend(proposal.token_ids)
    if proposal.q_ids:
        k = max(len(ids) for ids in proposal.q_ids)
        response.top_k = k
        for ids, probs in zip(proposal.q_ids, proposal.q_probs, strict=True):
            pad = k - len(ids)
            response.q_ids.extend([*ids, *([PAD_ID] * pad)])
            response.q_probs.extend([*probs, *([0.0] * pad)])
    return response


def proposal_fault(response: pb.ProposeResponse, gamma: int, vocab_size: int, sampled: bool) -> str | None:
    """What is wrong with a draft's answer, or None if it can be verified (a faulty one is decoded alone)."""
    ids = list(response.token_ids)
    if len(ids) > gamma:
        return f"{len(ids)} tokens proposed, {gamma} asked for"
    if any(not 0 <= t < vocab_size for t in ids):
        return f"a proposed token id is outside 0..{vocab_size - 1}"
    if not sampled or not ids:
        return None
    k = response.top_k
    if k < 1 or len(response.q_ids) != k * len(ids) or len(response.q_probs) != k * len(ids):
        return f"a sampled proposal needs top_k >= 1 and top_k entries per token (top_k {k}, {len(ids)} tokens)"
    for i, d in enumerate(ids):
        support = response.q_ids[i * k : (i + 1) * k]
        probs = response.q_probs[i * k : (i + 1) * k]
        if any(not (math.isfinite(q) and q >= 0.0) for q in probs) or abs(sum(probs) - 1.0) > 1e-3:
            return f"the proposal distribution at position {i + 1} is not a probability distribution"
        real = [t for t in support if t >= 0]
        if any(t >= vocab_size for t in real) or len(set(real)) != len(real):
            return f"the support at position {i + 1} holds an id outside the vocabulary or twice"
        if any(t < 0 and q != 0.0 for t, q in zip(support, probs, strict=True)):
            return f"padding at position {i + 1} carries probability"
        if not any(t == d and q > 0.0 for t, q in zip(support, probs, strict=True)):
            return f"token {d} at position {i + 1} has no probability in the distribution it was drawn from"
    return None


def decode(response: pb.ProposeResponse, gamma: int, vocab_size: int, sampled: bool) -> Proposal:
    """The proposal an answer carries, padding dropped; raises :class:`MalformedProposal` (see
    :func:`proposal_fault`) for an answer that cannot be verified."""
    fault = proposal_fault(response, gamma, vocab_size, sampled)
    if fault is not None:
        raise MalformedProposal(fault)
    token_ids = list(response.token_ids)
    k = response.top_k
    if not k or not sampled:
        return Proposal(token_ids)
    q_ids: list[list[int]] = []
    q_probs: list[list[float]] = []
    for i in range(len(token_ids)):
        entries = zip(response.q_ids[i * k : (i + 1) * k], response.q_probs[i * k : (i + 1) * k], strict=True)
        real = [(t, q) for t, q in entries if t >= 0]  # padding (and any negative id) carries nothing
        q_ids.append([t for t, _ in real])
        q_probs.append([q for _, q in real])
    return Proposal(token_ids, q_ids, q_probs)
