"""Lossless speculative sampling: the pure math between the draft's proposal and the target's verdict.

Notation (the StarSD paper's, after Leviathan et al. and Chen et al.): the draft M_q proposed
``d_1..d_gamma``, drawing ``d_i`` from its distribution ``q_i``; the target M_p computed, in one forward pass
over ``[x_last, d_1..d_gamma]``, distributions ``p_1..p_{gamma+1}``.

For i = 1..gamma, ``d_i`` is *accepted* with probability ``min(1, p_i(d_i) / q_i(d_i))``. On the first rejection
the round ends with a *recovered* token drawn from the residual ``norm(max(p_i - q_i, 0))``. If all gamma
are accepted, a *bonus* token is drawn from ``p_{gamma+1}``. Either way a round commits ``l + 1`` tokens
(``l`` accepted) and the committed tokens are distributed exactly as the target alone would produce them.

Greedy decoding is the limit where ``p`` and ``q`` are one-hot at their argmax: ``d_i`` is accepted iff it
equals the target's argmax, and the recovered / bonus token is the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from starsd.drafting import SamplingParams as SamplingParams  # defined torch-free, used here
from starsd.seeding import draft_seed


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verified round."""

    accepted: int  # l: how many drafted tokens were accepted (0..gamma)
    tokens: list[int]  # the l accepted tokens followed by the recovered or bonus token (l + 1 in all)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[..., V]`` into the sampling distribution ``[..., V]`` (temperature, then top-p).

    Greedy params give a one-hot distribution at the argmax, so that the same verification code serves both.
    """
    logits = logits.float()
    if params.greedy:
        probs = torch.zeros_like(logits)
        probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        return probs
    # Shift before scaling: the largest logit becomes 0, so no temperature >= GREEDY_BELOW can overflow.
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(shifted / params.temperature, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
    sorted_probs = torch.where(mass_before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def truncate_top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's compact proposal distribution: the top-k of ``probs [V]``, renormalised.

    Returns ``(ids [k], q [k])`` as float32; the draft samples from exactly this ``q`` and reports it, so the
    target can verify against the distribution that was really used (which keeps sampling lossless).
    """
    k = min(k, probs.shape[-1])
    top, ids = probs.topk(k, dim=-1)
    q = (top / top.sum()).to(torch.float32)
    return ids, q


def dense_from_sparse(ids: torch.Tensor, q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Scatter a top-k proposal ``(ids [G, k], q [G, k])`` into dense distributions ``[G, V]``.

    Padding entries (id < 0) carry probability 0 and are dropped.
    """
    valid = ids >= 0
    dense = torch.zeros(ids.shape[0], vocab_size, dtype=torch.float32)
    # Padding adds 0 at column 0, which leaves it as it is (scatter_add_, unlike scatter_, allows repeats).
    return dense.scatter_add_(1, ids.clamp(min=0), q.float().masked_fill(~valid, 0.0))


def target_generator(seed: int) -> torch.Generator:
    """The target's random stream for a completion seeded with ``seed`` (acceptance draws, recovered, bonus)."""
    return torch.Generator().manual_seed(seed)


def draft_generator(seed: int) -> torch.Generator:
    """The draft's random stream for the same completion: independent of the target's (see starsd.seeding)."""
    return torch.Generator().manual_seed(draft_seed(seed))


def draw_proposal(
    logits: torch.Tensor, params: SamplingParams, top_k: int, generator: torch.Generator | None
) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """The draft's choice from ``logits [V]``: ``(d, ids [k], q [k])``, or ``(argmax, None, None)`` when greedy.

    A sampled ``d`` is drawn from the renormalised top-k ``q`` that is reported with it (see truncate_top_k).
    """
    if params.greedy:
        return int(logits.argmax()), None, None
    ids, q = truncate_top_k(logits_to_probs(logits, params), top_k)
    return int(ids[sample(q, generator)]), ids, q


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs [V]`` (the exponential race: ``argmax(p_i / E_i)``, ``E_i ~ Exp(1)``).

    ``P(argmax = i) = p_i / sum(p)`` exactly, zero-probability tokens never win, and it costs one pass over V
    (``torch.multinomial`` costs several times more per call on the CPU).
    """
    race = torch.empty(probs.shape, dtype=torch.float32).exponential_(generator=generator)
    race.clamp_(min=torch.finfo(torch.float32).tiny)  # an exact 0 would turn 0 / 0 into NaN
    return int((probs / race).argmax())


def verify(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Accept a prefix of ``draft_tokens`` and add one target token (lossless speculative sampling).

    draft_tokens: ``d_1..d_gamma`` (gamma may be 0: plain decoding, the bonus token only).
    draft_probs: ``q [gamma, V]``, the distributions the drafts were drawn from; ``None`` for greedy drafts,
        which are treated as one-hot (a greedy draft is deterministic).
    target_probs: ``p [gamma + 1, V]`` from :func:`logits_to_probs` of the target's verify pass.
    """
    gamma = len(draft_tokens)
    if target_probs.shape[0] != gamma + 1:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows, expected gamma + 1 = {gamma + 1}")
    if draft_probs is not None and draft_probs.shape[0] != gamma:
        raise ValueError(f"draft_probs has {draft_probs.shape[0]} rows, expected gamma = {gamma}")
    accepted: list[int] = []
    for i, d in enumerate(draft_tokens):
        p_i = target_probs[i]
        if draft_probs is None:
            q_i = torch.zeros_like(p_i)
            q_i[d] = 1.0
        else:
            q_i = draft_probs[i].to(p_i.dtype)
        p_d, q_d = float(p_i[d]), float(q_i[d])
        if q_d <= 0.0:
            raise ValueError(f"draft token {d} at position {i + 1} has proposal probability 0")
        # Accept with probability min(1, p/q); p >= q accepts without drawing (keeps greedy draw-free).
        if p_d >= q_d or (p_d > 0.0 and _uniform(generator) < p_d / q_d):
            accepted.append(d)
            continue
        residual = torch.clamp(p_i - q_i, min=0.0)
        mass = float(residual.sum())
        # mass == 0 only if p == q up to rounding, where rejection has probability ~0; fall back to p.
        recovered = sample(residual / mass if mass > 0.0 else p_i, generator)
        return Verdict(accepted=len(accepted), tokens=[*accepted, recovered])
    bonus = target_probs[gamma]
    return Verdict(accepted=gamma, tokens=[*accepted, sample(bonus, generator)])


def verify_greedy(draft_tokens: list[int], target_argmax: list[int]) -> Verdict:
    """Greedy verification: accept drafts while they equal the target's argmax, then add the target's token.

    target_argmax: the target's argmax at each of the ``gamma + 1`` verified positions.
    """
    if len(target_argmax) != len(draft_tokens) + 1:
        raise ValueError(f"need gamma + 1 = {len(draft_tokens) + 1} target tokens, got {len(target_argmax)}")
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == target_argmax[accepted]:
        accepted += 1
    return Verdict(accepted=accepted, tokens=[*draft_tokens[:accepted], target_argmax[accepted]])


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), generator=generator))
