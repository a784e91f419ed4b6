"""Statistics helpers for the distribution tests (fixed seeds, so results are reproducible)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def chi2_critical(df: int, p_value: float = 1e-3) -> float:
    """Upper critical value of the chi-square distribution (Wilson-Hilferty approximation)."""
    z = {1e-2: 2.326, 1e-3: 3.090, 1e-4: 3.719}[p_value]
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi2_statistic(
    observed: Sequence[int], expected_probs: Sequence[float], min_expected: float = 5.0
) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom; cells expected below ``min_expected`` are pooled."""
    n = sum(observed)
    stat, df = 0.0, -1
    pooled_obs, pooled_exp = 0, 0.0
    for obs, prob in zip(observed, expected_probs, strict=True):
        exp = n * prob
        if exp < min_expected:
            pooled_obs += obs
            pooled_exp += exp
            continue
        stat += (obs - exp) ** 2 / exp
        df += 1
    if pooled_exp > 0:
        if pooled_exp >= min_expected:
            stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
            df += 1
        elif pooled_obs > 3 * min_expected:  # mass where (almost) none is expected
            stat = math.inf
    return stat, max(df, 1)


def fits(observed: Sequence[int], expected_probs: Sequence[float], p_value: float = 1e-3) -> bool:
    stat, df = chi2_statistic(observed, expected_probs)
    return stat < chi2_critical(df, p_value)
