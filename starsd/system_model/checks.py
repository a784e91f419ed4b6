"""Argument checks of the system model: each raises ``ValueError`` naming the argument."""

from __future__ import annotations

import math

# Relative slack for comparisons at the regime boundary, where N*tq and C are equal in exact arithmetic but
# may differ in the last bits (e.g. 3 * 0.1 vs 0.3).
EPS = 1e-9


def check_time(name: str, value: float, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and v <= 0.0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if v < 0.0:
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
    return v


def check_times(tq: float, tp: float, tc: float) -> tuple[float, float, float]:
    """``tq > 0``, ``tp >= 0``, ``tc >= 0``, all finite."""
    return (
        check_time("tq", tq, positive=True),
        check_time("tp", tp, positive=False),
        check_time("tc", tc, positive=False),
    )


def check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a probability, got {value!r}")
    v = float(value)
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return v


def check_cost(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def at_least(a: float, b: float) -> bool:
    """``a >= b`` up to :data:`EPS`, relative."""
    return a >= b * (1.0 - EPS)


def ceil(x: float) -> int:
    """``ceil(x)``, where ``x`` a few last bits above a whole number counts as that number."""
    return math.ceil(x * (1.0 - EPS))


def rounded(x: float) -> float:
    """``x`` to 9 significant digits: sums of equal shares in a different order compare equal."""
    return float(f"{x:.9g}")
