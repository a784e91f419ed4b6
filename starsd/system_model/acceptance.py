"""Acceptance: how many of ``gamma`` drafted tokens one round accepts (docs/architecture.md section 2).

``beta(y) = P(token y accepted | tokens 1..y-1 accepted)``. Tail-sum identity:
``E[l] = sum_{y=1..gamma} P(l >= y) = sum_{y=1..gamma} prod_{k<=y} beta(k)``; with a constant ``alpha``,
``E[l] + 1 = (1 - alpha^(gamma+1)) / (1 - alpha)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from starsd.system_model.checks import check_count, check_probability


class Acceptance(TypedDict, total=False):
    """The acceptance by keyword, exactly one of the two, as the functions that take the inputs one by one take it."""

    alpha: float | None  # constant per-position acceptance
    betas: Sequence[float] | None  # or per-position acceptance beta(1..gamma)


def position_acceptance(gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> list[float]:
    """``[beta(1), ..., beta(gamma)]`` from exactly one of a constant ``alpha`` or per-position ``betas``."""
    check_count("gamma", gamma, 1)
    if (alpha is None) == (betas is None):
        raise ValueError("give exactly one of alpha (constant acceptance) or betas (per-position acceptance)")
    if alpha is not None:
        return [check_probability("alpha", alpha)] * gamma
    assert betas is not None
    if isinstance(betas, str | bytes):
        raise ValueError("betas must be a sequence of probabilities")
    bs = [check_probability(f"betas[{i}]", b) for i, b in enumerate(betas)]
    if len(bs) != gamma:
        raise ValueError(f"betas must hold gamma={gamma} probabilities, got {len(bs)}")
    return bs


def accepted_length_tail(gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> list[float]:
    """``[P(l >= 1), ..., P(l >= gamma)]``: ``P(l >= y) = prod_{k<=y} beta(k)``."""
    tail: list[float] = []
    p = 1.0
    for b in position_acceptance(gamma, alpha, betas):
        p *= b
        tail.append(p)
    return tail


def accepted_length_distribution(
    gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None
) -> list[float]:
    """``[P(l = 0), ..., P(l = gamma)]``, the distribution of accepted draft tokens in one round."""
    tail = [1.0, *accepted_length_tail(gamma, alpha, betas), 0.0]
    return [tail[k] - tail[k + 1] for k in range(gamma + 1)]


def expected_accepted_length(gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> float:
    """``E[l]``, the expected number of accepted draft tokens per round (tail-sum identity).

    With a constant ``alpha`` this is the closed form ``(1 - alpha^(gamma+1)) / (1 - alpha) - 1``
    (``gamma`` when ``alpha == 1``).
    """
    if alpha is not None and betas is None:
        a = position_acceptance(gamma, alpha=alpha)[0]
        if a == 1.0:
            return float(gamma)
        return (1.0 - a ** (gamma + 1)) / (1.0 - a) - 1.0
    return math.fsum(accepted_length_tail(gamma, alpha, betas))


def expected_tokens_per_round(gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> float:
    """``E[l] + 1``: tokens one round commits (accepted drafts plus the target's own token)."""
    return expected_accepted_length(gamma, alpha, betas) + 1.0
