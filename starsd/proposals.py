"""What a draft is asked and what it answers, free of torch: the draft's server process imports only this.

The model itself (:mod:`starsd.draft.runner`) runs in the draft's model process; the server that speaks gRPC,
keeps sessions and schedules requests needs these few types and nothing heavier.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Temperatures below this decode greedily (argmax), as vLLM does: dividing logits by a tinier temperature
# overflows to inf/NaN, and the distribution is one-hot at the argmax to machine precision long before that.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How one completion is decoded. Greedy or sampled is decided here, once, and sent to the draft as such."""

    temperature: float = 0.0  # below GREEDY_BELOW means greedy (argmax)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    seed: int | None = None  # fixes the random stream of this completion (0 is a seed)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass
class Proposal:
    """What the draft proposes for one request."""

    token_ids: list[int]
    # Sampled proposals only: for each position, the top-k support and its exact probabilities.
    q_ids: list[list[int]] = field(default_factory=list)
    q_probs: list[list[float]] = field(default_factory=list)
    ahead: int = 0  # how many of token_ids had been drafted ahead, before the request came (starsd.draft.runner)


@dataclass(frozen=True)
class DraftRequest:
    """One session's share of a (batched) drafting step."""

    state: Any  # the proposer's per-session state (a KV cache and RNG, or a handle to them)
    new_tokens: list[int]
    gamma: int
    params: SamplingParams
    top_k: int
