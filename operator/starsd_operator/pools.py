"""Splitting the total target count across node pools by weight, within each pool's bounds.

Every pool first gets its ``minReplicas``; the rest are handed out one at a time, each to the pool with the
highest Sainte-Laguë priority ``weight / (replicas + 1/2)`` among those below ``maxReplicas`` (ties go to the
pool listed first). Handing out one at a time makes the split *house-monotone*: raising the total never
shrinks a pool, so a scale-up never deletes a running target. The total is kept whenever the bounds allow
it (``sum(min) <= total <= sum(max)``); outside them every pool sits at its nearer bound.

A pool of weight 0 only takes targets the weighted pools have no room for; when every weight is 0 they
count as equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from .spec import PoolSpec


def capacity(pools: Sequence[PoolSpec]) -> tuple[int, int]:
    """The fewest and most targets the pools can hold: ``(sum(min), sum(max))``."""
    return sum(p.min_replicas for p in pools), sum(p.max_replicas for p in pools)


def split(total: int, pools: Sequence[PoolSpec]) -> dict[str, int]:
    """Replicas per pool name, in the pools' order."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    replicas = [p.min_replicas for p in pools]
    weights = [p.weight for p in pools]
    if not any(weights):
        weights = [1] * len(pools)
    remaining = min(total, capacity(pools)[1]) - sum(replicas)
    while remaining > 0:
        best = -1
        best_priority = Fraction(-1)
        for i, pool in enumerate(pools):
            if replicas[i] >= pool.max_replicas:
                continue
            priority = Fraction(2 * weights[i], 2 * replicas[i] + 1)
            if priority > best_priority:
                best, best_priority = i, priority
        replicas[best] += 1
        remaining -= 1
    return {p.name: n for p, n in zip(pools, replicas, strict=True)}
