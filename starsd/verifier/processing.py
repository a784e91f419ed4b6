"""A request's changes to the target's logits: logit_bias, min_tokens, penalties, top_k (pure tensor functions).

They apply to the target's distribution only, at every verified position of a round. The draft still proposes
from its own distribution and reports it exactly, and verification accepts against the *changed* target
distribution, so the output follows exactly the distribution the target alone would sample with these changes
(greedy: the changed logits' argmax).

Position ``j`` of a round (``0..gamma``) follows the committed tokens and the round's drafts ``d_1..d_j``: the
penalties count those drafts as generated, and min_tokens counts them too, which is what the target alone would
have seen had it generated them. Order, as vLLM's: logit_bias, min_tokens, repetition / frequency / presence
penalties, then top_k (temperature and top_p follow in verification; top_k commutes with temperature).

A penalised completion keeps its token counts on the model's device (:class:`PenaltyCounts`): ``[V]`` counts of
the generated tokens, updated with each round's committed tokens by one scatter-add, and the prompt's tokens as
a ``[V]`` mask made once. A round then uploads only its drafts (``gamma`` ids) and adds their running one-hot
counts on the device, instead of building ``[gamma + 1, V]`` counts on the host. The counts are small integers in
fp32 (exact below 2**24), so the changed logits are bit-identical to those from counts recomputed from scratch
(:func:`generated_counts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LogitRules:
    """What a request changes in the target's logits (the defaults change nothing)."""

    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    min_tokens: int = 0  # the ids in ``end_ids`` are impossible until this many tokens are generated
    end_ids: tuple[int, ...] = ()  # the tokens that end a completion (EOS unless ignore_eos, stop_token_ids)
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the logits
    presence_penalty: float = 0.0  # subtracted once from every token generated so far
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # tokens in the prompt or generated: positive logits / p, negative * p

    @property
    def active(self) -> bool:
        return bool(
            self.top_k
            or (self.min_tokens and self.end_ids)
            or self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
        )

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def generated_counts(generated: list[int], drafts: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """``[gamma + 1, V]``: how often each token was generated before each verified position of a round."""
    base = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=vocab)[:vocab].float()
    counts = base.unsqueeze(0).repeat(len(drafts) + 1, 1)
    for j, d in enumerate(drafts):
        counts[j + 1 :, d] += 1.0
    return counts.to(device)


class PenaltyCounts:
    """A completion's penalty state on the model's device: how often each token was generated (``counts [V]``,
    fp32) and which tokens the prompt holds (``in_prompt [V]``); :meth:`add` takes each round's committed tokens."""

    def __init__(self, prompt: list[int], vocab: int, device: torch.device) -> None:
        self.vocab, self.device = vocab, device
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
        if prompt:
            self.in_prompt[torch.tensor(prompt, dtype=torch.long).to(device)] = True

    def add(self, tokens: list[int]) -> None:
        """Count the tokens a round committed (one upload of their ids, one scatter-add)."""
        if tokens:
            ids = torch.tensor(tokens, dtype=torch.long).to(self.device)
            self.counts.scatter_add_(0, ids, torch.ones(len(tokens), dtype=torch.float32, device=self.device))

    def round_counts(self, drafts: list[int]) -> torch.Tensor:
        """``[gamma + 1, V]``: the counts before each verified position of a round (what :func:`generated_counts`
        gives for the same generated tokens and drafts)."""
        counts = self.counts.unsqueeze(0).repeat(len(drafts) + 1, 1)
        if drafts:
            ids = torch.tensor(drafts, dtype=torch.long).to(self.device)
            running = torch.nn.functional.one_hot(ids, self.vocab).cumsum(dim=0).float()  # [gamma, V]
            counts[1:] += running
        return counts


def apply_rules(
    logits: torch.Tensor,
    rules: LogitRules,
    prompt: list[int],
    generated: list[int],
    drafts: list[int],
    penalty: PenaltyCounts | None = None,
) -> torch.Tensor:
    """The changed logits ``[gamma + 1, V]`` of a round whose verified positions have ``logits [gamma + 1, V]``.

    ``penalty``: the completion's counts kept on the device, which must count exactly ``generated`` and
    ``prompt``; without it (or for another vocabulary) the counts are recomputed from ``generated``."""
    logits = logits.float().clone()
    vocab, device = logits.shape[-1], logits.device
    if rules.logit_bias:
        ids = torch.tensor(list(rules.logit_bias), dtype=torch.long, device=device)
        bias = torch.tensor(list(rules.logit_bias.values()), dtype=torch.float32, device=device)
        logits[:, ids] += bias
    if rules.min_tokens and rules.end_ids:
        short = [j for j in range(logits.shape[0]) if len(generated) + j < rules.min_tokens]
        if short:
            ends = torch.tensor(rules.end_ids, dtype=torch.long, device=device)
            rows = torch.tensor(short, dtype=torch.long, device=device)
            logits[rows.unsqueeze(1), ends.unsqueeze(0)] = float("-inf")
    if rules.penalised:
        on_device = penalty is not None and penalty.vocab == vocab and penalty.counts.device == device
        if on_device:
            assert penalty is not None
            counts = penalty.round_counts(drafts)
        else:
            counts = generated_counts(generated, drafts, vocab, device)
        if rules.repetition_penalty != 1.0:
            seen = counts > 0
            if on_device:
                assert penalty is not None
                seen |= penalty.in_prompt.unsqueeze(0)
            elif prompt:
                in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
                in_prompt[torch.tensor(prompt, dtype=torch.long, device=device)] = True
                seen |= in_prompt.unsqueeze(0)
            p = rules.repetition_penalty
            logits = torch.where(seen, torch.where(logits > 0, logits / p, logits * p), logits)
        logits -= rules.frequency_penalty * counts + rules.presence_penalty * (counts > 0).float()
    if rules.top_k and rules.top_k < vocab:
        kth = logits.topk(rules.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def round_processor(
    rules: LogitRules,
    prompt: list[int],
    generated: list[int],
    drafts: list[int],
    penalty: PenaltyCounts | None = None,
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The :attr:`starsd.verifier.runner.StepRow.process` of one round (None when the rules change nothing);
    ``penalty``: the completion's :class:`PenaltyCounts`, counting ``generated`` (see :func:`apply_rules`)."""
    if not rules.active:
        return None
    before, proposed = list(generated), list(drafts)
    return lambda logits: apply_rules(logits, rules, prompt, before, proposed, penalty)
