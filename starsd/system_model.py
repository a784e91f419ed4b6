"""The system model of a star: one draft serving N targets (docs/architecture.md section 2).

Notation (times in seconds, throughput in tokens per second):

* One round of one session: the draft proposes ``gamma`` tokens, the target accepts ``l`` of them
  (``0 <= l <= gamma``) and adds one token of its own (the correction or the bonus), so a round commits
  ``l + 1`` tokens.
* ``beta(y) = P(token y accepted | tokens 1..y-1 accepted)``. Tail-sum identity:
  ``E[l] = sum_{y=1..gamma} P(l >= y) = sum_{y=1..gamma} prod_{k<=y} beta(k)``; with a constant ``alpha``,
  ``E[l] + 1 = (1 - alpha^(gamma+1)) / (1 - alpha)``.
* ``tq`` the draft's service time for one request, ``tp`` the target's verify time, ``tc`` the one-way
  transfer time (request or response, serialisation included). A target's cycle without queueing is
  ``C = tq + tp + 2*tc``.
* ``N`` targets on one draft that serves one request at a time: ``rho = min(1, N*tq / C)`` and
  ``O(N) = N * (E[l]+1) / max(C, N*tq)``. Under-loaded when ``N*tq < C`` (the draft idles, throughput grows
  linearly with N); fully loaded when ``N*tq >= C`` (the draft never idles, throughput is capped at
  ``(E[l]+1)/tq``, more targets only queue). ``N* = ceil(1 + (tp + 2*tc)/tq)`` is the smallest fully-loaded N.

Batched drafts: a draft that runs ``B`` waiting requests in one forward pass takes ``Tq(B)`` for the batch, so
each request costs the draft ``Tq(B)/B`` of its time while still waiting ``Tq(B)`` for its own answer. A small
draft is memory-bound: a forward pass is dominated by reading its weights, which is the same for 1 or 8
sequences, so ``Tq(B)`` grows slowly with ``B``, ``Tq(B)/B`` falls almost as ``1/B``, the draft's capacity
``B*(E[l]+1)/Tq(B)`` grows almost ``B``-fold, and one draft feeds many more targets
(``N*_B = ceil(B * (1 + (tp + 2*tc)/Tq(B)))``). See :class:`BatchCurve` and :func:`batched_throughput`.

Everything here is a pure function of its arguments; bad arguments raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Regime(StrEnum):
    """The draft's load regime; members equal their strings (``Regime.FULLY_LOADED == "FullyLoaded"``)."""

    UNDER_LOADED = "UnderLoaded"
    FULLY_LOADED = "FullyLoaded"


# --- validation -----------------------------------------------------------------------------------


def _check_time(name: str, value: float, *, positive: bool) -> float:
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


def _check_times(tq: float, tp: float, tc: float) -> tuple[float, float, float]:
    return (
        _check_time("tq", tq, positive=True),
        _check_time("tp", tp, positive=False),
        _check_time("tc", tc, positive=False),
    )


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a probability, got {value!r}")
    v = float(value)
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return v


def position_acceptance(gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> list[float]:
    """``[beta(1), ..., beta(gamma)]`` from exactly one of a constant ``alpha`` or per-position ``betas``."""
    _check_count("gamma", gamma, 1)
    if (alpha is None) == (betas is None):
        raise ValueError("give exactly one of alpha (constant acceptance) or betas (per-position acceptance)")
    if alpha is not None:
        return [_check_probability("alpha", alpha)] * gamma
    assert betas is not None
    if isinstance(betas, str | bytes):
        raise ValueError("betas must be a sequence of probabilities")
    bs = [_check_probability(f"betas[{i}]", b) for i, b in enumerate(betas)]
    if len(bs) != gamma:
        raise ValueError(f"betas must hold gamma={gamma} probabilities, got {len(bs)}")
    return bs


# --- acceptance -----------------------------------------------------------------------------------


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


# --- one draft serving one request at a time ------------------------------------------------------


def cycle_time(tq: float, tp: float, tc: float) -> float:
    """``C = tq + tp + 2*tc``: one target's round without queueing at the draft."""
    tq, tp, tc = _check_times(tq, tp, tc)
    return tq + tp + 2.0 * tc


def round_time(n: int, tq: float, tp: float, tc: float) -> float:
    """Steady-state time of one round of each of ``n`` targets: ``max(C, n*tq)`` (queueing included)."""
    _check_count("n", n, 1)
    return max(cycle_time(tq, tp, tc), n * tq)


def utilization(n: int, tq: float, tp: float, tc: float) -> float:
    """The draft's busy fraction ``rho = min(1, n*tq / C)``."""
    _check_count("n", n, 1)
    c = cycle_time(tq, tp, tc)
    return 1.0 if _at_least(n * tq, c) else n * tq / c


def regime(n: int, tq: float, tp: float, tc: float) -> Regime:
    """``FullyLoaded`` when ``n*tq >= C`` (the draft never idles), else ``UnderLoaded``."""
    _check_count("n", n, 1)
    return Regime.FULLY_LOADED if _at_least(n * tq, cycle_time(tq, tp, tc)) else Regime.UNDER_LOADED


def throughput(
    n: int,
    tq: float,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
) -> float:
    """``O(N) = N * (E[l]+1) / max(C, N*tq)``: tokens per second committed by all ``n`` targets together."""
    return n * expected_tokens_per_round(gamma, alpha, betas) / round_time(n, tq, tp, tc)


def per_target_latency(
    n: int,
    tq: float,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
) -> float:
    """Seconds per committed token seen by one target: ``max(C, N*tq) / (E[l]+1)``."""
    return round_time(n, tq, tp, tc) / expected_tokens_per_round(gamma, alpha, betas)


def optimal_targets(tq: float, tp: float, tc: float) -> int:
    """``N* = ceil(1 + (tp + 2*tc)/tq)``: the fewest targets that keep the draft from idling (Lemma 3.2).

    Below ``N*`` the draft idles and each extra target adds throughput; above it throughput stays at the
    draft's capacity ``(E[l]+1)/tq`` and each extra target only adds queueing delay.
    """
    tq, tp, tc = _check_times(tq, tp, tc)
    return _ceil(1.0 + (tp + 2.0 * tc) / tq)


def draft_capacity(tq: float, gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None) -> float:
    """The most tokens per second one unbatched draft can feed: ``(E[l]+1)/tq``."""
    tq = _check_time("tq", tq, positive=True)
    return expected_tokens_per_round(gamma, alpha, betas) / tq


# --- batched draft --------------------------------------------------------------------------------


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
            _check_count("batch size", b, 1)
            pts.append((b, _check_time(f"Tq({b})", t, positive=True)))
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
        _check_count("batch size", b, 1)
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


def batched_point(
    n: int,
    curve: BatchCurve,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
    batch: int | None = None,
) -> BatchedPoint:
    """``n`` targets on a draft running batches of ``batch`` requests (default: the best ``B <= n``).

    Targets in groups of ``B`` share a pass: a round lasts ``max(Tq(B) + tp + 2*tc, n*Tq(B)/B)`` — the
    unbatched formula with ``Tq(B)`` as the wait and ``Tq(B)/B`` as the draft's cost per request. By default
    the model picks the ``B`` (at most ``n`` and the curve's largest) with the highest throughput: ``B = 1``
    while the draft idles anyway, larger batches only once it is saturated. This is an upper bound: it
    assumes targets fall into groups that arrive together, whereas a draft that batches whatever is waiting
    also makes a request that arrives mid-pass wait for that pass (about ``rho * Tq(B) / 2`` more per round
    when under-loaded); once saturated, the bound is reached.
    """
    _check_count("n", n, 1)
    tp = _check_time("tp", tp, positive=False)
    tc = _check_time("tc", tc, positive=False)
    tokens = expected_tokens_per_round(gamma, alpha, betas)

    def point(b: int) -> BatchedPoint:
        tqb = curve.tq(b)
        cost = tqb / b
        c = tqb + tp + 2.0 * tc
        rt = max(c, n * cost)
        return BatchedPoint(
            n=n,
            batch=b,
            tq_batch=tqb,
            per_request_time=cost,
            cycle_time=c,
            round_time=rt,
            utilization=1.0 if _at_least(n * cost, c) else n * cost / c,
            regime=Regime.FULLY_LOADED if _at_least(n * cost, c) else Regime.UNDER_LOADED,
            throughput=n * tokens / rt,
        )

    if batch is not None:
        _check_count("batch", batch, 1)
        if batch > n:
            raise ValueError(f"batch={batch} cannot exceed the number of targets n={n}")
        return point(batch)
    candidates = [point(b) for b in range(1, min(n, curve.max_batch) + 1)]
    return max(candidates, key=lambda p: (p.throughput, -p.batch))


def batched_throughput(
    n: int,
    curve: BatchCurve,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
    batch: int | None = None,
) -> float:
    """``O_B(N) = N*(E[l]+1) / max(Tq(B) + tp + 2*tc, N*Tq(B)/B)``; see :func:`batched_point`."""
    return batched_point(n, curve, tp, tc, gamma, alpha, betas, batch).throughput


def batched_capacity(
    curve: BatchCurve, gamma: int, alpha: float | None = None, betas: Sequence[float] | None = None
) -> float:
    """The most tokens per second one batching draft can feed: ``(E[l]+1) * B / Tq(B)`` at its best ``B``."""
    return expected_tokens_per_round(gamma, alpha, betas) / curve.per_request_time(curve.best_batch())


def batched_optimal_targets(curve: BatchCurve, tp: float, tc: float) -> int:
    """``N*_B = ceil(B * (1 + (tp + 2*tc)/Tq(B)))`` at the curve's best batch: the fewest targets that keep
    a batching draft saturated. With a flat (memory-bound) curve this is close to ``B`` times the unbatched
    N*."""
    tp = _check_time("tp", tp, positive=False)
    tc = _check_time("tc", tc, positive=False)
    b = curve.best_batch()
    return _ceil(b * (1.0 + (tp + 2.0 * tc) / curve.tq(b)))


# --- the plan: one row per N ----------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRow:
    """The model's prediction for ``n`` targets on one draft."""

    n: int
    regime: Regime
    utilization: float  # draft busy fraction
    throughput: float  # tokens/s, all targets together: O(N)
    per_target_throughput: float  # tokens/s of one target
    latency_per_token: float  # seconds per committed token seen by one target
    round_time: float  # seconds per round of one target, queueing included
    batch: int  # requests per draft pass (1 without a batch curve)
    optimal: bool  # n == N*

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regime"] = str(self.regime)
        return d


def plan(
    tq: float,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
    ns: Sequence[int] | None = None,
    batch_curve: BatchCurve | None = None,
) -> list[PlanRow]:
    """The model's table over ``ns`` (default ``1..max(8, 2*N*)``), marking ``N*``.

    With ``batch_curve`` the draft batches (``tq`` must then equal ``Tq(1)`` of the curve) and ``N*`` is the
    batched one.
    """
    tq, tp, tc = _check_times(tq, tp, tc)
    tokens = expected_tokens_per_round(gamma, alpha, betas)
    if batch_curve is not None:
        if not math.isclose(batch_curve.tq(1), tq, rel_tol=1e-9):
            raise ValueError(f"tq={tq} differs from the batch curve's Tq(1)={batch_curve.tq(1)}")
        n_star = batched_optimal_targets(batch_curve, tp, tc)
    else:
        n_star = optimal_targets(tq, tp, tc)
    if ns is None:
        ns = range(1, max(8, 2 * n_star) + 1)
    rows: list[PlanRow] = []
    for n in ns:
        _check_count("n", n, 1)
        if batch_curve is not None:
            p = batched_point(n, batch_curve, tp, tc, gamma, alpha, betas)
            reg, util, rt, b = p.regime, p.utilization, p.round_time, p.batch
        else:
            reg, util, rt, b = regime(n, tq, tp, tc), utilization(n, tq, tp, tc), round_time(n, tq, tp, tc), 1
        rows.append(
            PlanRow(
                n=n,
                regime=reg,
                utilization=util,
                throughput=n * tokens / rt,
                per_target_throughput=tokens / rt,
                latency_per_token=rt / tokens,
                round_time=rt,
                batch=b,
                optimal=n == n_star,
            )
        )
    return rows


# --- a star of stars: D drafts, each feeding its share of the targets --------------------------------


def star_capacity(drafts: int, n_star: int) -> int:
    """The targets ``drafts`` drafts keep busy: ``D * N*`` (each draft saturates at its own ``N*``)."""
    _check_count("drafts", drafts, 1)
    _check_count("n_star", n_star, 1)
    return drafts * n_star


def split_targets(targets: int, drafts: int) -> list[int]:
    """How ``targets`` targets spread over ``drafts`` drafts: as evenly as possible (the assignment's balance,
    :mod:`starsd.assignment`), the larger shares first."""
    _check_count("targets", targets, 0)
    _check_count("drafts", drafts, 1)
    q, r = divmod(targets, drafts)
    return [q + 1] * r + [q] * (drafts - r)


def star_throughput(
    drafts: int,
    targets: int,
    tq: float,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
    batch_curve: BatchCurve | None = None,
) -> float:
    """Tokens per second of ``targets`` targets spread evenly over ``drafts`` drafts: the sum of each draft's
    ``O(n_i)`` (drafts share nothing; a draft with no target adds nothing)."""
    total = 0.0
    for n in split_targets(targets, drafts):
        if n == 0:
            continue
        if batch_curve is not None:
            total += batched_throughput(n, batch_curve, tp, tc, gamma, alpha, betas)
        else:
            total += throughput(n, tq, tp, tc, gamma, alpha, betas)
    return total


@dataclass(frozen=True)
class StarOption:
    """``drafts`` drafts and ``targets`` targets (one accelerator each) and what the model says of them."""

    drafts: int
    targets: int
    gpus: int  # drafts + targets
    throughput: float  # tokens/s, every target together
    cost: float  # drafts * draft_cost + targets * target_cost
    throughput_per_cost: float
    targets_per_draft: float
    utilization: float  # the busiest draft's
    regime: Regime  # the busiest draft's

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regime"] = str(self.regime)
        return d


@dataclass(frozen=True)
class StarPlan:
    """The best ``(D, N)`` for ``gpus`` accelerators: by throughput and by throughput per cost; ``by_drafts``
    holds, for each ``D``, its best ``N`` by throughput."""

    gpus: int
    draft_cost: float
    target_cost: float
    optimal_targets: int  # one draft's N*
    best_throughput: StarOption
    best_per_cost: StarOption
    by_drafts: tuple[StarOption, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "draft_cost": self.draft_cost,
            "target_cost": self.target_cost,
            "optimal_targets": self.optimal_targets,
            "best_throughput": self.best_throughput.to_dict(),
            "best_per_cost": self.best_per_cost.to_dict(),
            "by_drafts": [o.to_dict() for o in self.by_drafts],
        }


def _check_cost(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def star_option(
    drafts: int,
    targets: int,
    tq: float,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
    batch_curve: BatchCurve | None = None,
    draft_cost: float = 1.0,
    target_cost: float = 1.0,
) -> StarOption:
    """The model's view of ``drafts`` drafts and ``targets`` targets, the targets spread evenly."""
    _check_count("drafts", drafts, 1)
    _check_count("targets", targets, 1)
    draft_cost = _check_cost("draft_cost", draft_cost)
    target_cost = _check_cost("target_cost", target_cost)
    busiest = split_targets(targets, drafts)[0]
    if batch_curve is not None:
        p = batched_point(busiest, batch_curve, tp, tc, gamma, alpha, betas)
        util, reg = p.utilization, p.regime
    else:
        util, reg = utilization(busiest, tq, tp, tc), regime(busiest, tq, tp, tc)
    out = star_throughput(drafts, targets, tq, tp, tc, gamma, alpha, betas, batch_curve)
    cost = drafts * draft_cost + targets * target_cost
    return StarOption(
        drafts=drafts,
        targets=targets,
        gpus=drafts + targets,
        throughput=out,
        cost=cost,
        throughput_per_cost=out / cost,
        targets_per_draft=targets / drafts,
        utilization=util,
        regime=reg,
    )


def best_star(
    gpus: int,
    tq: float,
    tp: float,
    tc: float,
    gamma: int,
    alpha: float | None = None,
    betas: Sequence[float] | None = None,
    batch_curve: BatchCurve | None = None,
    draft_cost: float = 1.0,
    target_cost: float = 1.0,
) -> StarPlan:
    """The best ``(D, N)`` with ``D + N <= gpus`` (``D, N >= 1``; a draft or a target takes one accelerator,
    priced ``draft_cost`` and ``target_cost`` per accelerator).

    * **By throughput**: the most tokens/s; on a tie (targets past ``D * N*`` only queue) the cheaper, then
      the one with fewer drafts. With equal costs this fills the accelerators so that no draft idles and no
      target queues: about ``D = G / (N* + 1)`` drafts of ``N*`` targets each.
    * **By throughput per cost**: the most tokens/s per unit of cost, among every option that fits in
      ``gpus``; on a tie the one with more throughput, then fewer drafts. A cheap draft accelerator moves it
      towards more drafts (fewer targets each, none of them queueing).
    """
    _check_count("gpus", gpus, 2)
    tq, tp, tc = _check_times(tq, tp, tc)
    n_star = batched_optimal_targets(batch_curve, tp, tc) if batch_curve else optimal_targets(tq, tp, tc)
    options = [
        star_option(d, n, tq, tp, tc, gamma, alpha, betas, batch_curve, draft_cost, target_cost)
        for d in range(1, gpus)
        for n in range(1, gpus - d + 1)
    ]

    def by_throughput(o: StarOption) -> tuple[float, float, int]:
        return (_rounded(o.throughput), -o.cost, -o.drafts)

    def by_per_cost(o: StarOption) -> tuple[float, float, int]:
        return (_rounded(o.throughput_per_cost), _rounded(o.throughput), -o.drafts)

    per_d: dict[int, StarOption] = {}
    for o in options:
        if o.drafts not in per_d or by_throughput(o) > by_throughput(per_d[o.drafts]):
            per_d[o.drafts] = o
    return StarPlan(
        gpus=gpus,
        draft_cost=float(draft_cost),
        target_cost=float(target_cost),
        optimal_targets=n_star,
        best_throughput=max(options, key=by_throughput),
        best_per_cost=max(options, key=by_per_cost),
        by_drafts=tuple(per_d[d] for d in sorted(per_d)),
    )


def _rounded(x: float) -> float:
    """``x`` to 9 significant digits: sums of equal shares in a different order compare equal."""
    return float(f"{x:.9g}")


# --- helpers --------------------------------------------------------------------------------------

# Relative slack for comparisons at the regime boundary, where N*tq and C are equal in exact arithmetic but
# may differ in the last bits (e.g. 3 * 0.1 vs 0.3).
_EPS = 1e-9


def _at_least(a: float, b: float) -> bool:
    return a >= b * (1.0 - _EPS)


def _ceil(x: float) -> int:
    return math.ceil(x * (1.0 - _EPS))
