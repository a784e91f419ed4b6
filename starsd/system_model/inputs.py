"""The model's inputs, checked once, and what they say of one draft with ``n`` targets.

:class:`StarInputs` holds the measured times, the proposal length and its acceptance, and the draft's batch
curve; a draft that serves one request at a time has the one-point curve ``((1, tq),)``, so there is one
formula for both (:meth:`StarInputs.point`). The derived quantities (``E[l]+1``, ``N*``, the capacity) are
computed once, on first use; ``starsd plan``, the star's planner, the benchmark's analysis and adaptive gamma
all read them from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Unpack

from starsd.system_model.acceptance import Acceptance, expected_tokens_per_round, position_acceptance
from starsd.system_model.checks import check_count, check_times
from starsd.system_model.curve import BatchCurve, batched_optimal_targets
from starsd.system_model.one_draft import Regime, busy_fraction, load_regime


@dataclass(frozen=True)
class BatchedPoint:
    """The model's view of ``n`` targets on a draft that batches ``batch`` requests per pass."""

    n: int
    batch: int
    tq_batch: float  # Tq(B): what each request waits at the draft
    per_request_time: float  # Tq(B)/B: what each request costs the draft
    cycle_time: float  # Tq(B) + tp + 2*tc
    round_time: float  # max(cycle_time, n * Tq(B)/B)
    utilization: float  # min(1, n * Tq(B)/B / cycle_time)
    regime: Regime
    throughput: float  # n * (E[l]+1) / round_time


class Given(Acceptance, total=False):
    """What :class:`StarInputs` takes after ``tq, tp, tc, gamma``, by keyword: the acceptance and the batch curve."""

    batch_curve: BatchCurve | None  # Tq(B) of a batching draft; None: one request per pass


@dataclass(frozen=True)
class StarInputs:
    """What the system model is evaluated with; bad values raise ``ValueError`` naming the field.

    Give exactly one of ``alpha`` and ``betas``. With ``batch_curve`` the draft batches, and ``tq`` must be
    the curve's ``Tq(1)``.
    """

    tq: float  # seconds: the draft's service time for one request alone, Tq(1)
    tp: float  # seconds: the target's verify time per round
    tc: float  # seconds: one-way transfer time (request or response)
    gamma: int  # tokens drafted per round
    alpha: float | None = None  # constant per-position acceptance
    betas: Sequence[float] | None = None  # or per-position acceptance beta(1..gamma), kept as a tuple
    batch_curve: BatchCurve | None = None  # Tq(B) of a batching draft; None: one request per pass

    def __post_init__(self) -> None:
        tq, tp, tc = check_times(self.tq, self.tp, self.tc)
        position_acceptance(self.gamma, self.alpha, self.betas)  # checks gamma, alpha and betas
        if self.batch_curve is not None and not math.isclose(self.batch_curve.tq(1), tq, rel_tol=1e-9):
            raise ValueError(f"tq={tq} differs from the batch curve's Tq(1)={self.batch_curve.tq(1)}")
        for name, value in (("tq", tq), ("tp", tp), ("tc", tc)):
            object.__setattr__(self, name, value)
        if self.betas is not None:
            object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    @cached_property
    def tokens_per_round(self) -> float:
        """``E[l] + 1``: tokens one round commits."""
        return expected_tokens_per_round(self.gamma, self.alpha, self.betas)

    @cached_property
    def curve(self) -> BatchCurve:
        """``Tq(B)``: the batch curve, or the one point ``(1, tq)`` of a draft without batching."""
        return self.batch_curve if self.batch_curve is not None else BatchCurve.unbatched(self.tq)

    @cached_property
    def cycle_time(self) -> float:
        """``C = tq + tp + 2*tc``: one target's round without queueing, one request per pass."""
        return self.tq + self.tp + 2.0 * self.tc

    @cached_property
    def optimal_targets(self) -> int:
        """``N*`` (``N*_B`` of a batching draft): the fewest targets that keep the draft from idling."""
        return batched_optimal_targets(self.curve, self.tp, self.tc)

    @cached_property
    def capacity(self) -> float:
        """The most tokens per second the draft can feed: ``(E[l]+1) * B / Tq(B)`` at its best ``B``."""
        return self.tokens_per_round / self.curve.per_request_time(self.curve.best_batch())

    def point(self, n: int, batch: int | None = None) -> BatchedPoint:
        """``n`` targets on the draft running batches of ``batch`` requests (default: the best ``B <= n``).

        Targets in groups of ``B`` share a pass: a round lasts ``max(Tq(B) + tp + 2*tc, n*Tq(B)/B)`` — the
        unbatched formula with ``Tq(B)`` as the wait and ``Tq(B)/B`` as the draft's cost per request. By
        default the model picks the ``B`` (at most ``n`` and the curve's largest) with the highest throughput:
        ``B = 1`` while the draft idles anyway, larger batches only once it is saturated. This is an upper
        bound: it assumes targets fall into groups that arrive together, whereas a draft that batches whatever
        is waiting also makes a request that arrives mid-pass wait for that pass (about ``rho * Tq(B) / 2``
        more per round when under-loaded); once saturated, the bound is reached. Without a batch curve this
        is the unbatched model: ``B = 1``, ``max(C, n*tq)``.
        """
        check_count("n", n, 1)
        if batch is not None:
            check_count("batch", batch, 1)
            if batch > n:
                raise ValueError(f"batch={batch} cannot exceed the number of targets n={n}")
            return self._point(n, batch)
        candidates = [self._point(n, b) for b in range(1, min(n, self.curve.max_batch) + 1)]
        return max(candidates, key=lambda p: (p.throughput, -p.batch))

    def _point(self, n: int, b: int) -> BatchedPoint:
        wait = self.curve.tq(b)
        cost = wait / b
        cycle = wait + self.tp + 2.0 * self.tc
        rt = max(cycle, n * cost)
        return BatchedPoint(
            n=n,
            batch=b,
            tq_batch=wait,
            per_request_time=cost,
            cycle_time=cycle,
            round_time=rt,
            utilization=busy_fraction(n * cost, cycle),
            regime=load_regime(n * cost, cycle),
            throughput=n * self.tokens_per_round / rt,
        )


class Batched(Acceptance, total=False):
    """The keywords of :func:`batched_point`: the acceptance, and the batch size to evaluate (default: the best)."""

    batch: int | None


def batched_point(
    n: int, curve: BatchCurve, tp: float, tc: float, gamma: int, **given: Unpack[Batched]
) -> BatchedPoint:
    """``n`` targets on a draft with batch curve ``curve``: :meth:`StarInputs.point`."""
    inputs = StarInputs(curve.tq(1), tp, tc, gamma, given.get("alpha"), given.get("betas"), curve)
    return inputs.point(n, given.get("batch"))


def batched_throughput(n: int, curve: BatchCurve, tp: float, tc: float, gamma: int, **given: Unpack[Batched]) -> float:
    """``O_B(N) = N*(E[l]+1) / max(Tq(B) + tp + 2*tc, N*Tq(B)/B)``; see :meth:`StarInputs.point`."""
    return batched_point(n, curve, tp, tc, gamma, **given).throughput
