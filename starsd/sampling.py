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

from starsd.proposals import SamplingParams as SamplingParams  # defined torch-free, used here
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


def probs_batch(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """:func:`logits_to_probs` for ``logits [B, T, V]`` with one row's params each, in one pass on the device."""
    logits = logits.float()
    device = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=device).view(-1, 1, 1)
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device).view(-1, 1, 1)
    top_p = torch.tensor([p.top_p for p in params], device=device).view(-1, 1, 1)
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax(shifted / temperature, dim=-1)
    if any(p.top_p < 1.0 and not p.greedy for p in params):
        probs = torch.where(top_p < 1.0, _top_p_filter(probs, top_p), probs)
    if any(p.greedy for p in params):
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy, one_hot, probs)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
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
    """Scatter a top-k proposal ``(ids [..., k], q [..., k])`` into dense distributions ``[..., V]``.

    Padding entries (id < 0) carry probability 0 and are dropped.
    """
    valid = ids >= 0
    dense = torch.zeros(*ids.shape[:-1], vocab_size, dtype=torch.float32, device=ids.device)
    # Padding adds 0 at column 0, which leaves it as it is (scatter_add_, unlike scatter_, allows repeats).
    return dense.scatter_add_(-1, ids.clamp(min=0), q.float().masked_fill(~valid, 0.0))


def target_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The target's random stream for a completion seeded with ``seed`` (acceptance draws, recovered, bonus)."""
    return torch.Generator(device=device).manual_seed(seed)


def draft_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The draft's random stream for the same completion: independent of the target's (see starsd.seeding)."""
    return torch.Generator(device=device).manual_seed(draft_seed(seed))


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


def draw_proposals(
    logits: torch.Tensor,
    params: list[SamplingParams],
    top_ks: list[int],
    generators: list[torch.Generator | None],
    live: list[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`draw_proposal` for B rows at once, on the device with no host sync: ``logits [B, V]`` ->
    ``(d [B], ids [B, K], q [B, K])``, ``K`` the largest sampled row's top-k (a row of a smaller ``k`` has zeros
    past its own ``k``), or ``(argmax [B], None, None)`` when every row is greedy.

    A sampled row draws exactly what :func:`draw_proposal` draws from its own generator (one exponential race
    over its ``k`` support ids), so a seed gives the same proposals alone or in a batch; a greedy row draws
    nothing and gets its argmax, and so does a row whose ``live`` is False (one that has proposed all it asked
    for while others go on: its result is not used, and its random stream must not move).
    """
    sampled = [b for b, p in enumerate(params) if not p.greedy]
    if not sampled:
        return logits.argmax(dim=-1), None, None
    batch, vocab = logits.shape
    k = min(max(top_ks[b] for b in sampled), vocab)
    probs = probs_batch(logits.unsqueeze(1), params).squeeze(1)  # [B, V]; greedy rows one-hot at the argmax
    top, ids = probs.topk(k, dim=-1)  # [B, K]
    races = torch.ones(batch, k, device=logits.device)  # greedy rows: index 0 wins (their one-hot's argmax)
    for b in sampled:
        own = min(top_ks[b], vocab)
        if own < k:
            top[b, own:] = 0.0  # outside the row's own top-k: probability 0, never drawn
        if live is None or live[b]:
            races[b, :own] = exponential_race((own,), generators[b], logits.device)
    q = (top / top.sum(dim=-1, keepdim=True)).to(torch.float32)
    choice = (q / races).argmax(dim=-1, keepdim=True)  # [B, 1]
    return ids.gather(1, choice).squeeze(1), ids, q


def exponential_race(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | None = None
) -> torch.Tensor:
    """``E_i ~ Exp(1)`` of ``shape``, each > 0: ``argmax(w_i / E_i)`` draws ``i`` with probability ``w_i / sum(w)``."""
    race = torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)
    return race.clamp_(min=torch.finfo(torch.float32).tiny)  # an exact 0 would turn 0 / 0 into NaN


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs [V]`` (weights need not sum to 1) with the exponential race.

    ``P(argmax = i) = p_i / sum(p)`` exactly, zero-weight tokens never win, and it costs one pass over V
    (``torch.multinomial`` costs several times more per call on the CPU).
    """
    race = exponential_race(tuple(probs.shape), generator, probs.device)
    return int((probs / race).argmax())


def round_draws(
    gamma: int, vocab_size: int, generator: torch.Generator | None, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sampled round's random numbers, always drawn in this order: ``gamma`` acceptance uniforms, then one
    exponential race over the vocabulary for the round's last token (recovered or bonus).

    The reference :func:`verify` and the batched :func:`verify_batch` both draw exactly these, so one seed gives
    one result whether a session is verified alone or in a batch.
    """
    uniforms = torch.rand(gamma, generator=generator, device=device)
    return uniforms, exponential_race((vocab_size,), generator, device)


def verify(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Accept a prefix of ``draft_tokens`` and add one target token (lossless speculative sampling).

    The per-sequence reference: the servers verify with :func:`verify_batch`, which tests hold to this.

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
    uniforms, race = round_draws(gamma, target_probs.shape[-1], generator, target_probs.device)
    accepted: list[int] = []
    for i, d in enumerate(draft_tokens):
        p_i = target_probs[i]
        if draft_probs is None:
            q_i = torch.zeros_like(p_i)
            q_i[d] = 1.0
        else:
            q_i = draft_probs[i].to(p_i.dtype)
        if float(q_i[d]) <= 0.0:
            raise ValueError(f"draft token {d} at position {i + 1} has proposal probability 0")
        # Accept with probability min(1, p/q): u < p/q, with u uniform in [0, 1) (the ratio in p's dtype).
        if float(uniforms[i]) < float(p_i[d] / q_i[d]):
            accepted.append(d)
            continue
        residual = torch.clamp(p_i - q_i, min=0.0)  # norm(max(p - q, 0)); the race needs no normalising
        # An empty residual means p == q up to rounding, where rejection has probability ~0: fall back to p.
        weights = residual if float(residual.sum()) > 0.0 else p_i
        return Verdict(accepted=len(accepted), tokens=[*accepted, int((weights / race).argmax())])
    bonus = target_probs[gamma]
    return Verdict(accepted=gamma, tokens=[*accepted, int((bonus / race).argmax())])


def step_draws(
    gammas: list[int], width: int, vocab_size: int, generators: list[torch.Generator | None], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms ``[B, width]`` and races ``[B, V]`` for a batched step: each sampled row's own
    :func:`round_draws` from its own generator; greedy rows (generator None) get 0 and 1 (nothing random)."""
    uniforms = torch.zeros(len(gammas), width, device=device)
    races = torch.ones(len(gammas), vocab_size, device=device)
    for b, (gamma, gen) in enumerate(zip(gammas, generators, strict=True)):
        if gen is not None:
            u, race = round_draws(gamma, vocab_size, gen, device)
            uniforms[b, :gamma] = u
            races[b] = race
    return uniforms, races


@dataclass(frozen=True)
class BatchVerdict:
    """The outcome of one verified step for B sequences, as tensors on the model's device."""

    accepted: torch.Tensor  # [B] l per row
    last: torch.Tensor  # [B] the recovered or bonus token of each row


def verify_batch(
    drafts: torch.Tensor,
    gammas: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    races: torch.Tensor,
) -> BatchVerdict:
    """:func:`verify` for B sequences at once, as tensor operations on the model's device (no host sync).

    drafts ``[B, G]`` (rows padded past their own gamma), gammas ``[B]``, draft_probs ``q [B, G, V]`` (one-hot
    rows for greedy drafts), target_probs ``p [B, G + 1, V]``, uniforms ``[B, G]`` and races ``[B, V]`` from
    :func:`round_draws` per row (greedy rows: uniforms 0 and races 1, so nothing random happens to them: a
    one-hot ``p`` accepts exactly the drafts equal to its argmax, and its residual is its argmax).
    """
    batch, width = drafts.shape
    positions = torch.arange(width, device=drafts.device)
    live = positions.unsqueeze(0) < gammas.unsqueeze(1)  # [B, G]: positions within each row's gamma
    index = drafts.unsqueeze(-1)  # [B, G, 1]
    p_d = target_probs[:, :width].gather(-1, index).squeeze(-1)  # [B, G]
    q_d = draft_probs.gather(-1, index).squeeze(-1)  # [B, G]
    ok = (uniforms < p_d / q_d) & live
    accepted = ok.long().cumprod(dim=-1).sum(dim=-1)  # [B]: l, the accepted prefix
    rows = torch.arange(batch, device=drafts.device)
    p_l = target_probs[rows, accepted]  # [B, V]: the rejected position's p, or the bonus position's
    rejected = accepted < gammas
    q_l = draft_probs[rows, accepted.clamp(max=max(width - 1, 0))] if width else torch.zeros_like(p_l)
    q_l = q_l * rejected.unsqueeze(-1)  # no q at the bonus position
    residual = torch.clamp(p_l - q_l, min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0.0
    weights = torch.where(empty, p_l, residual)
    return BatchVerdict(accepted=accepted, last=(weights / races).argmax(dim=-1))


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
