"""Greedy speculative decoding, simulated, to measure how often the target accepts the draft's tokens.

A round (gamma = ``gamma``): the draft proposes ``d_1..d_gamma`` greedily from the committed context; the target
computes its own greedy token after ``context, d_1..d_{i-1}`` for i = 1..gamma+1 (one verify pass); ``l`` is
the length of the longest prefix where they agree, and the round commits ``d_1..d_l`` plus the target's token
at position ``l + 1`` (the correction, or the bonus when ``l = gamma``). The committed text is therefore exactly
the target's greedy continuation. Reported: per-token acceptance ``sum(l) / sum(gamma)`` and the mean accepted
length ``E[l] = sum(l) / rounds``.

The round logic takes two plain functions so that it can be checked by hand; :func:`model_functions` builds them
from two causal LMs (recomputing the whole context each time: simple, and fast enough for models this small).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# propose(context, gamma) -> the draft's gamma greedy tokens after context
ProposeFn = Callable[[Sequence[int], int], list[int]]
# verify(context, drafts) -> the target's greedy token after context + drafts[:i], for i = 0..len(drafts)
VerifyFn = Callable[[Sequence[int], Sequence[int]], list[int]]


@dataclass
class AcceptanceStats:
    """Counts over simulated rounds."""

    rounds: int = 0
    drafted: int = 0  # sum of gamma over rounds
    accepted: int = 0  # sum of l over rounds
    generated: int = 0  # tokens committed (after truncation at max_new_tokens / EOS)
    accepted_lengths: list[int] = field(default_factory=list)  # l of every round

    @property
    def per_token_acceptance(self) -> float:
        """accepted / drafted: the fraction of proposed tokens the target kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """E[l]: accepted draft tokens per round (a round commits E[l] + 1 tokens)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    def merge(self, other: AcceptanceStats) -> None:
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.generated += other.generated
        self.accepted_lengths.extend(other.accepted_lengths)


def accepted_prefix(drafts: Sequence[int], target_tokens: Sequence[int]) -> int:
    """l: how many leading drafts equal the target's greedy tokens at the same positions."""
    n = 0
    for d, t in zip(drafts, target_tokens, strict=False):
        if d != t:
            break
        n += 1
    return n


def speculative_greedy(
    prompt: Sequence[int],
    max_new_tokens: int,
    gamma: int,
    propose: ProposeFn,
    verify: VerifyFn,
    eos_token_id: int | None = None,
) -> tuple[list[int], AcceptanceStats]:
    """Generate up to ``max_new_tokens`` after ``prompt`` in speculative rounds; returns (tokens, stats).

    Every round drafts the full ``gamma`` and counts its full verdict, even when the end of the budget (or EOS)
    cuts its committed tokens short.
    """
    if gamma < 1:
        raise ValueError("gamma must be at least 1")
    context = list(prompt)
    out: list[int] = []
    stats = AcceptanceStats()
    while len(out) < max_new_tokens:
        drafts = propose(context, gamma)
        if len(drafts) != gamma:
            raise ValueError(f"propose returned {len(drafts)} tokens, expected {gamma}")
        target_tokens = verify(context, drafts)
        if len(target_tokens) != gamma + 1:
            raise ValueError(f"verify returned {len(target_tokens)} tokens, expected {gamma + 1}")
        n = accepted_prefix(drafts, target_tokens)
        committed = [*drafts[:n], target_tokens[n]]
        stats.rounds += 1
        stats.drafted += gamma
        stats.accepted += n
        stats.accepted_lengths.append(n)
        for tok in committed:
            if len(out) >= max_new_tokens:
                break
            out.append(tok)
            context.append(tok)
            if tok == eos_token_id:
                stats.generated = len(out)
                return out, stats
    stats.generated = len(out)
    return out, stats


def model_functions(draft: Any, target: Any) -> tuple[ProposeFn, VerifyFn]:
    """``propose`` and ``verify`` for two causal LMs (``transformers`` models returning ``.logits``)."""

    @torch.no_grad()
    def propose(context: Sequence[int], gamma: int) -> list[int]:
        seq = list(context)
        for _ in range(gamma):
            logits = draft(input_ids=torch.tensor([seq])).logits  # [1, T, V]
            seq.append(int(logits[0, -1].argmax()))
        return seq[len(context) :]

    @torch.no_grad()
    def verify(context: Sequence[int], drafts: Sequence[int]) -> list[int]:
        seq = [*context, *drafts]
        logits = target(input_ids=torch.tensor([seq])).logits  # [1, T, V]
        # Position len(context)-1 predicts the token after the context; the last one the bonus.
        return [int(t) for t in logits[0, len(context) - 1 :].argmax(dim=-1)]

    return propose, verify


@torch.no_grad()
def greedy_agreement(draft: Any, target: Any, batches: Sequence[torch.Tensor]) -> float:
    """Fraction of positions of held-out windows where the draft's and the target's argmax agree.

    Teacher-forced on real text (no generation): a quick proxy for acceptance.
    """
    same, total = 0, 0
    for batch in batches:
        inputs = batch[:, :-1]
        a = draft(input_ids=inputs).logits.argmax(dim=-1)  # [B, T]
        b = target(input_ids=inputs).logits.argmax(dim=-1)  # [B, T]
        same += int((a == b).sum())
        total += a.numel()
    return same / max(1, total)
