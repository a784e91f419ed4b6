"""A draft's batch curve ``Tq(B)``, and what it says without the targets: ``N*_B`` and the draft's capacity.

A draft that runs ``B`` waiting requests in one forward pass takes ``Tq(B)`` for the batch, so each request
costs the draft ``Tq(B)/B`` of its time while still waiting ``Tq(B)`` for its own answer. A small draft is
memory-bound: a forward pass is dominated by reading its weights, which is the same for 1 or 8 sequences, so
``Tq(B)`` grows slowly with ``B``, ``Tq(B)/B`` falls almost as ``1/B``, the draft's capacity
``B*(E[l]+1)/Tq(B)`` grows almost ``B``-fold, and one draft feeds many more targets
(``N*_B = ceil(B * (1 + (tp + 2*tc)/Tq(B)))``). A draft that serves one request at a time is the one-point
curve ``((1, tq),)``, for which every formula here is the unbatched one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from starsd.system_model.acceptance import expected_tokens_per_round
from starsd.system_model.checks import ceil, check_count, check_time


@dataclass(frozen=True)
class BatchCurve:
    """The draft's service time ``Tq(B)`` for a batch of ``B`` requests, from measured points.

    Between points ``Tq`` is interpolated linearly in ``B``; the largest measured ``B`` is the largest batch
    the model lets the draft run. A memory-bound small draft has a flat curve (``Tq(8)`` a little above
    ``Tq(1)``), so its per-request cost ``Tq(B)/B`` falls almost as ``1/B``: that is why one batching draft
    can feed many more targets than one that serves requests one at a time.
    """

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a batch curve needs at least one point B:seconds")
        pts: list[tuple[int, float]] = []
        for b, t in self.points:
            check_count("batch size", b, 1)
            pts.append((b, check_time(f"Tq({b})", t, positive=True)))
        pts.sort()
        if pts[0][0] != 1:
            raise ValueError("a batch curve must include B=1 (the unbatched service time)")
        for (b0, t0), (b1, t1) in itertools.pairwise(pts):
            if b0 == b1:
                raise ValueError(f"batch size {b0} appears twice in the batch curve")
            if t1 < t0:
                raise ValueError(f"Tq(B) must not fall as B grows: Tq({b1})={t1} < Tq({b0})={t0}")
        object.__setattr__(self, "points", tuple(pts))

    @classmethod
    def unbatched(cls, tq: float) -> BatchCurve:
        """The curve of a draft that serves one request at a time: the one point ``(1, tq)``."""
        return cls(((1, tq),))

    @classmethod
    def parse(cls, text: str, unbatched: float | None = None) -> BatchCurve:
        """Parse ``"1:0.004,8:0.006"`` (batch size : seconds, comma separated); ``unbatched`` supplies
        ``Tq(1)`` when the text has no ``1:`` point."""
        pts: list[tuple[int, float]] = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            b, sep, t = item.partition(":")
            if not sep:
                raise ValueError(f"batch curve point {item!r} is not B:SECONDS")
            try:
                pts.append((int(b), float(t)))
            except ValueError:
                raise ValueError(f"batch curve point {item!r} is not B:SECONDS") from None
        if unbatched is not None and all(b != 1 for b, _ in pts):
            pts.insert(0, (1, unbatched))
        return cls(tuple(pts))

    @property
    def max_batch(self) -> int:
        return self.points[-1][0]

    def tq(self, b: int) -> float:
        """``Tq(B)``, linearly interpolated between measured points."""
        check_count("batch size", b, 1)
        if b > self.max_batch:
            raise ValueError(f"batch size {b} exceeds the curve's largest measured batch {self.max_batch}")
        for (b0, t0), (b1, t1) in itertools.pairwise(self.points):
            if b0 <= b <= b1:
                return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
        return self.points[0][1]  # a single-point curve: B must be 1

    def up_to(self, b: int) -> BatchCurve:
        """The curve of a draft that batches at most ``b`` requests (the points beyond ``b`` dropped)."""
        if b >= self.max_batch:
            return self
        return BatchCurve((*((x, t) for x, t in self.points if x < b), (b, self.tq(b))))

    def per_request_time(self, b: int) -> float:
        """``Tq(B)/B``: the draft time one request costs when it shares a batch of ``B``."""
        return self.tq(b) / b

    def best_batch(self) -> int:
        """The batch size with the lowest per-request cost (the draft's capacity); the smallest on ties."""
        return min(range(1, self.max_batch + 1), key=lambda b: (self.per_request_time(b), b))

    def batching_gain(self) -> float:
        """How many times more requests per second the draft serves at its best batch than unbatched."""
        return self.tq(1) / self.per_request_time(self.best_batch())


def batched_capacity(
    curve: BatchCurve, gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None
) -> float:
    """The most tokens per second one batching draft can feed: ``(E[l]+1) * B / Tq(B)`` at its best ``B``."""
    return expected_tokens_per_round(gamma, alpha, betas) / curve.per_request_time(curve.best_batch())


def batched_optimal_targets(curve: BatchCurve, tp: float, tc: float) -> int:
    """``N*_B = ceil(B * (1 + (tp + 2*tc)/Tq(B)))`` at the curve's best batch: the fewest targets that keep
    a batching draft saturated. With a flat (memory-bound) curve this is close to ``B`` times the unbatched
    N*."""
    tp = check_time("tp", tp, positive=False)
    tc = check_time("tc", tc, positive=False)
    b = curve.best_batch()
    return ceil(b * (1.0 + (tp + 2.0 * tc) / curve.tq(b)))
