"""Adaptive gamma: each session picks how many tokens to ask the draft for, with the system model.

A longer proposal is cheap while the draft is under-loaded (targets wait on their own verify time anyway),
and costly when the draft is the bottleneck (every drafted token is draft time taken from other sessions).
The choice maximises the system model's per-session throughput

    O(gamma) = (E[l](gamma, alpha) + 1) / max(C(gamma), N * Tq(gamma)),
    Tq(gamma) = gamma * t_token,  C(gamma) = Tq(gamma) + Tp + 2 Tc,

with ``alpha`` this session's observed acceptance, ``N`` the sessions the draft serves (it reports them),
``t_token`` the draft's measured time per proposed token, ``Tp`` this target's measured verify time. Greedy
output does not depend on gamma, so adapting it never changes what a client receives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from starsd.system_model import StarInputs


@dataclass
class AcceptanceEstimate:
    """A discounted estimate of a session's per-token acceptance ``alpha``.

    A round that drafted ``g`` tokens and accepted ``l`` shows ``l`` acceptances and, when ``l < g``, one
    rejection; ``alpha = accepted / (accepted + rejected)`` is the maximum-likelihood estimate for a
    constant alpha. Old rounds are discounted so the estimate follows the text as it changes.
    """

    accepted: float = 2.0  # prior: alpha = 2/3 before any round
    rejected: float = 1.0
    decay: float = 0.97

    def update(self, accepted: int, drafted: int) -> None:
        if drafted <= 0:
            return
        self.accepted = self.decay * self.accepted + accepted
        self.rejected = self.decay * self.rejected + (1.0 if accepted < drafted else 0.0)

    @property
    def alpha(self) -> float:
        return min(0.99, max(0.01, self.accepted / (self.accepted + self.rejected)))


def ewma(mean: float, sample: float, weight: float = 0.1) -> float:
    """An exponentially weighted mean; ``mean`` NaN means no sample yet (the first sample is taken as is)."""
    return sample if math.isnan(mean) else (1.0 - weight) * mean + weight * sample


def session_throughput(gamma: int, alpha: float, token_time: float, tp: float, tc: float, sessions: int) -> float:
    """Tokens per second one of ``sessions`` identical sessions commits, per the system model (one request per
    draft pass, ``Tq = gamma * token_time``; ``token_time`` must be > 0)."""
    return StarInputs(gamma * token_time, tp, tc, gamma, alpha=alpha).point(sessions).throughput / sessions


def choose_gamma(
    alpha: float, token_time: float, tp: float, tc: float, sessions: int, max_gamma: int, min_gamma: int = 1
) -> int:
    """The gamma in ``min_gamma..max_gamma`` with the best modelled throughput (the smaller on ties)."""
    if max_gamma < min_gamma:
        raise ValueError(f"max_gamma {max_gamma} < min_gamma {min_gamma}")
    if not token_time > 0.0:  # nothing measured yet (or nothing usable): no reason to change
        return max_gamma
    sessions = max(1, sessions)
    best, best_value = min_gamma, -1.0
    for gamma in range(min_gamma, max_gamma + 1):
        value = session_throughput(gamma, alpha, token_time, tp, tc, sessions)
        if value > best_value * (1.0 + 1e-9):
            best, best_value = gamma, value
    return best
