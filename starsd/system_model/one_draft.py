"""One draft serving ``N`` targets one request at a time: the closed forms of docs/architecture.md section 2.

``C = tq + tp + 2*tc`` is one target's round without queueing; ``N`` targets ask the draft for ``N*tq`` of
its time per round. ``rho = min(1, N*tq / C)``, ``O(N) = N * (E[l]+1) / max(C, N*tq)``;
``N* = ceil(1 + (tp + 2*tc)/tq)`` is the smallest fully-loaded ``N``. A batching draft is the same
arithmetic with other numbers (:mod:`starsd.system_model.inputs`): :func:`busy_fraction` and
:func:`load_regime` serve both.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Unpack

from starsd.system_model.acceptance import Acceptance, expected_tokens_per_round
from starsd.system_model.checks import at_least, ceil, check_count, check_time, check_times


class Regime(StrEnum):
    """The draft's load regime; members equal their strings (``Regime.FULLY_LOADED == "FullyLoaded"``)."""

    UNDER_LOADED = "UnderLoaded"
    FULLY_LOADED = "FullyLoaded"


def busy_fraction(demand: float, cycle: float) -> float:
    """``rho = min(1, demand / C)``: ``demand`` is the draft time the targets ask for per round."""
    return 1.0 if at_least(demand, cycle) else demand / cycle


def load_regime(demand: float, cycle: float) -> Regime:
    """``FullyLoaded`` when the targets ask the draft for at least a cycle's time per round."""
    return Regime.FULLY_LOADED if at_least(demand, cycle) else Regime.UNDER_LOADED


def cycle_time(tq: float, tp: float, tc: float) -> float:
    """``C = tq + tp + 2*tc``: one target's round without queueing at the draft."""
    tq, tp, tc = check_times(tq, tp, tc)
    return tq + tp + 2.0 * tc


def round_time(n: int, tq: float, tp: float, tc: float) -> float:
    """Steady-state time of one round of each of ``n`` targets: ``max(C, n*tq)`` (queueing included)."""
    check_count("n", n, 1)
    return max(cycle_time(tq, tp, tc), n * tq)


def utilization(n: int, tq: float, tp: float, tc: float) -> float:
    """The draft's busy fraction ``rho = min(1, n*tq / C)``."""
    check_count("n", n, 1)
    return busy_fraction(n * tq, cycle_time(tq, tp, tc))


def regime(n: int, tq: float, tp: float, tc: float) -> Regime:
    """``FullyLoaded`` when ``n*tq >= C`` (the draft never idles), else ``UnderLoaded``."""
    check_count("n", n, 1)
    return load_regime(n * tq, cycle_time(tq, tp, tc))


def throughput(n: int, tq: float, tp: float, tc: float, gamma: int, **acceptance: Unpack[Acceptance]) -> float:
    """``O(N) = N * (E[l]+1) / max(C, N*tq)``: tokens per second committed by all ``n`` targets together."""
    return n * expected_tokens_per_round(gamma, **acceptance) / round_time(n, tq, tp, tc)


def per_target_latency(n: int, tq: float, tp: float, tc: float, gamma: int, **acceptance: Unpack[Acceptance]) -> float:
    """Seconds per committed token seen by one target: ``max(C, N*tq) / (E[l]+1)``."""
    return round_time(n, tq, tp, tc) / expected_tokens_per_round(gamma, **acceptance)


def optimal_targets(tq: float, tp: float, tc: float) -> int:
    """``N* = ceil(1 + (tp + 2*tc)/tq)``: the fewest targets that keep the draft from idling (Lemma 3.2).

    Below ``N*`` the draft idles and each extra target adds throughput; above it throughput stays at the
    draft's capacity ``(E[l]+1)/tq`` and each extra target only adds queueing delay.
    """
    tq, tp, tc = check_times(tq, tp, tc)
    return ceil(1.0 + (tp + 2.0 * tc) / tq)


def draft_capacity(tq: float, gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> float:
    """The most tokens per second one unbatched draft can feed: ``(E[l]+1)/tq``."""
    tq = check_time("tq", tq, positive=True)
    return expected_tokens_per_round(gamma, alpha, betas) / tq
