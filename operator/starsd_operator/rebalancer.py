"""The rebalancer's control law: how many targets the draft should feed (docs/rebalancer.md).

A pure function of a policy, the current target counts, a trace of load samples and the recent changes, so
it is tested over generated traces with no cluster and no clock.

**Two signals.** Every ``/v1/load`` reading carries the draft's own load (utilisation, queue, regime, N*) and
the targets' demand, which the targets report to the draft on their streams: requests running and waiting,
and their batch occupancy (running / max-num-seqs, averaged over the connected targets). Each reading makes
one *recommendation*, a target count, from the current count ``n``:

1. **Targets idle** (occupancy below ``scaleInOccupancy``, nothing waiting at the targets or the draft):
   ``minTargets``, whatever the draft's load: a target with nothing to do wastes a GPU.
2. **Draft saturated** (utilisation at or above ``saturatedUtilization`` and requests queueing at the draft):
   ``min(n, N*)``: more targets than N* only queue behind the draft. Not while requests wait at the targets
   (unless ``scaleInWhileWaiting``): their clients would lose the targets serving them, so the count holds
   (and the draft count goes up where ``maxDrafts`` allows, :func:`recommend_drafts`).
3. **Draft under-loaded and targets saturated** (the draft's utilisation below ``underloadedUtilization``
   or its regime ``UnderLoaded`` with no queue; requests waiting at the targets or occupancy at or above
   ``saturatedOccupancy``): ``max(n, N*)``.
4. Otherwise ``n``: hold.

A recommendation within the **tolerance** band (``|r - n| <= tolerance * n``) counts as ``n``. N* is the
draft's ``recommended_targets``, or the system model's (:func:`starsd.system_model.optimal_targets`) on the
reported times when the draft gives none; a rule that needs N* holds without it.

**Stabilisation, as the HPA's.** Up and down have their own windows (``scaleUp`` / ``scaleDown``
``stabilizationWindowSeconds``). The count goes up only to the *smallest* recommendation in the up window,
and down only to the *largest* in the down window, and only once the readings span the whole window; so a
signal that swings faster than the window never moves the count, and a steady one moves it once its window
is full.

**Rate limits.** One decision moves at most the direction's ``maxStep``; its ``policies`` (``Pods`` or
``Percent`` per ``periodSeconds``, combined by ``selectPolicy`` ``Max``, ``Min`` or ``Disabled``) cap the
change over each period, counted from the changes made in it. The result always lies within
``minTargets..maxTargets`` and what the pools can hold.

**Convergence.** No decision while the targets are not all ready, until ``convergenceTimeoutSeconds`` have
passed: then it decides on the *ready* count (a target that never becomes ready, e.g. unschedulable,
must not freeze the cluster), and says so in the decision.

**No metrics, no action.** A reading with no window or no connected target recommends nothing.

**Several drafts** (docs/architecture.md section 2: ``D`` drafts keep ``D * N*`` targets busy). Each draft's
reading is taken, and :func:`aggregate` makes the one reading the target count is decided on: the *worst*
(busiest) draft's utilisation and regime, the *total* demand (targets, sessions, requests, queue) and N* summed
over the drafts. The draft count has its own decision, :func:`decide_drafts`, with the same windows, rate
limits and convergence as the target count, one draft per step, within ``minDrafts..maxDrafts``
(:func:`draft_policy`); its recommendation (:func:`recommend_drafts`):

1. **Drafts and targets idle** (every draft's utilisation below ``underloadedUtilization``, target occupancy
   below ``scaleInOccupancy``, nothing waiting): one draft fewer.
2. **Every draft saturated while targets have demand** (every draft's utilisation at or above
   ``saturatedUtilization``; requests waiting at the targets or occupancy at or above ``saturatedOccupancy``):
   one draft more. More targets would only queue behind saturated drafts; another draft serves them.
3. Otherwise hold; also while fewer drafts than the count report their load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# Reasons a decision changes the count (status.lastRebalance.reason).
UNDER_LOADED = "UnderLoaded"
SATURATED = "Saturated"
TARGETS_IDLE = "TargetsIdle"
# Reasons a decision changes the number of drafts (status.drafts.lastRebalance.reason).
DRAFTS_SATURATED = "DraftsSaturated"
DRAFTS_IDLE = "DraftsIdle"
# Reasons a decision holds.
DISABLED = "Disabled"
NOT_CONVERGED = "NotConverged"
NO_METRICS = "NoMetrics"
STABILIZING = "Stabilizing"
BALANCED = "Balanced"
AT_BOUND = "AtBound"
RATE_LIMITED = "RateLimited"
# The Rebalancing condition's reason (and the Warning Event's) while an HPA scales the cluster.
EXTERNAL_AUTOSCALER = "ExternalAutoscaler"
# The Rebalancing condition's reason while deciding on the ready count after the convergence timeout.
CONVERGENCE_TIMEOUT = "ConvergenceTimeout"

POLICY_PODS = "Pods"
POLICY_PERCENT = "Percent"
SELECT_MAX = "Max"
SELECT_MIN = "Min"
SELECT_DISABLED = "Disabled"


@dataclass(frozen=True)
class Load:
    """One reading of the draft's ``/v1/load`` (the contract is in docs/rebalancer.md)."""

    utilization: float
    window_seconds: float
    tq_seconds: float
    tp_seconds: float
    tc_seconds: float
    queue_depth: float
    targets: int
    regime: str
    active_sessions: int
    recommended_targets: int
    running_requests: int = 0
    waiting_requests: int = 0
    target_occupancy: float = 0.0
    # The drafts' own readings when this one aggregates several (:func:`aggregate`); empty for one reading.
    per_draft: tuple[Load, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Load:
        """Validate a ``/v1/load`` body; raises ``ValueError`` naming the bad field."""

        def number(key: str, default: float | None = None) -> float:
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"/v1/load field {key!r} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"/v1/load field {key!r} must be >= 0, got {value!r}")
            return float(value)

        regime = data.get("regime", "")
        if not isinstance(regime, str):
            raise ValueError(f"/v1/load field 'regime' must be a string, got {regime!r}")
        return cls(
            utilization=min(1.0, number("utilization")),
            window_seconds=number("window_seconds"),
            tq_seconds=number("tq_seconds", 0.0),
            tp_seconds=number("tp_seconds", 0.0),
            tc_seconds=number("tc_seconds", 0.0),
            queue_depth=number("queue_depth", 0.0),
            targets=int(number("targets", 0.0)),
            regime=regime,
            active_sessions=int(number("active_sessions", 0.0)),
            recommended_targets=int(number("recommended_targets", 0.0)),
            running_requests=int(number("running_requests", 0.0)),
            waiting_requests=int(number("waiting_requests", 0.0)),
            target_occupancy=min(1.0, number("target_occupancy", 0.0)),
        )

    def optimal_targets(self) -> int | None:
        """N*: the draft's own figure, else the system model's from the reported times, else unknown."""
        if self.recommended_targets >= 1:
            return self.recommended_targets
        if self.tq_seconds > 0:
            from starsd import system_model  # imported late so the operator starts lean

            return system_model.optimal_targets(self.tq_seconds, self.tp_seconds, self.tc_seconds)
        return None

    @property
    def empty(self) -> bool:
        """Nothing to go on: no measuring window, or no target connected to report its demand."""
        return self.window_seconds <= 0 or self.targets < 1


def aggregate(loads: Sequence[Load]) -> Load:
    """One reading for several drafts: the busiest draft's utilisation and regime, the total demand (targets,
    sessions, requests, queue), occupancy averaged over the connected targets, N* summed over the drafts (a
    draft that knows none counts as the others' mean) and the shortest window; ``per_draft`` keeps them all."""
    if not loads:
        raise ValueError("aggregate needs at least one draft's reading")
    worst = max(loads, key=lambda x: x.utilization)
    targets = sum(x.targets for x in loads)
    known = [n for n in (x.optimal_targets() for x in loads) if n]
    n_star = sum(known) + (len(loads) - len(known)) * math.ceil(sum(known) / len(known)) if known else 0
    timed = [x for x in loads if x.tq_seconds > 0] or list(loads)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    return Load(
        utilization=worst.utilization,
        window_seconds=min(x.window_seconds for x in loads),
        tq_seconds=mean([x.tq_seconds for x in timed]),
        tp_seconds=mean([x.tp_seconds for x in timed]),
        tc_seconds=mean([x.tc_seconds for x in timed]),
        queue_depth=sum(x.queue_depth for x in loads),
        targets=targets,
        regime=worst.regime,
        active_sessions=sum(x.active_sessions for x in loads),
        recommended_targets=n_star,
        running_requests=sum(x.running_requests for x in loads),
        waiting_requests=sum(x.waiting_requests for x in loads),
        target_occupancy=sum(x.target_occupancy * x.targets for x in loads) / targets if targets else 0.0,
        per_draft=tuple(loads),
    )


@dataclass(frozen=True)
class Sample:
    """A reading taken at ``at`` (seconds) while the cluster had ``replicas`` targets, ``ready`` of them."""

    at: float
    replicas: int
    ready: int
    load: Load


@dataclass(frozen=True)
class Change:
    """A change of the count made at ``at`` (seconds) from ``previous`` to ``replicas``."""

    at: float
    previous: int
    replicas: int


@dataclass(frozen=True)
class RatePolicy:
    """At most ``value`` pods (``Pods``) or percent of the count (``Percent``) per ``period_seconds``."""

    kind: str
    value: int
    period_seconds: float


@dataclass(frozen=True)
class Direction:
    """How the count may move one way: the HPA's ``behavior.scaleUp`` / ``scaleDown``."""

    window_seconds: float
    max_step: int
    policies: tuple[RatePolicy, ...] = ()
    select: str = SELECT_MAX


@dataclass(frozen=True)
class Policy:
    enabled: bool
    min_targets: int
    max_targets: int
    pool_capacity: tuple[int, int]  # (sum of pool minimums, sum of pool maximums)
    underloaded_utilization: float = 0.7
    saturated_utilization: float = 0.9
    scale_in_occupancy: float = 0.1
    saturated_occupancy: float = 0.8
    tolerance: float = 0.1
    scale_in_while_waiting: bool = False  # a saturated draft may remove targets that have requests waiting
    up: Direction = field(default_factory=lambda: Direction(window_seconds=30.0, max_step=4))
    down: Direction = field(default_factory=lambda: Direction(window_seconds=300.0, max_step=2))
    convergence_timeout_seconds: float = 600.0

    @property
    def bounds(self) -> tuple[int, int]:
        """The counts the rebalancer may choose: inside both the autoscaling and the pools' bounds."""
        lo = max(self.min_targets, self.pool_capacity[0])
        hi = min(self.max_targets, self.pool_capacity[1])
        return lo, max(lo, hi)

    @property
    def history_seconds(self) -> float:
        """How far back :func:`decide` looks: the longer window, or the longest rate-limit period."""
        periods = [p.period_seconds for d in (self.up, self.down) for p in d.policies]
        return max([self.up.window_seconds, self.down.window_seconds, *periods])


@dataclass(frozen=True)
class Decision:
    replicas: int  # the count to set; the current one when holding
    previous: int
    reason: str
    message: str
    timed_out: bool = False  # decided on the ready count after the convergence timeout

    @property
    def changed(self) -> bool:
        return self.replicas != self.previous


@dataclass(frozen=True)
class Recommendation:
    replicas: int
    reason: str  # UNDER_LOADED, SATURATED, TARGETS_IDLE or BALANCED
    why: str


def recommend(policy: Policy, n: int, load: Load) -> Recommendation:
    """The count one reading argues for, from the current count ``n`` (rules 1-4 of the module's doc)."""
    n_star = load.optimal_targets()
    occupancy = f"target occupancy {load.target_occupancy:.2f}"
    if load.target_occupancy < policy.scale_in_occupancy and load.waiting_requests == 0 and load.queue_depth <= 0:
        # As few as the bounds allow: decide() clamps to minTargets.
        return _tolerant(policy, n, 0, TARGETS_IDLE, f"targets idle ({occupancy} < {policy.scale_in_occupancy:g})")
    draft = f"draft utilization {load.utilization:.2f}, queue {load.queue_depth:g}, N* = {n_star}"
    if load.utilization >= policy.saturated_utilization and load.queue_depth > 0:
        if n_star is None:
            return Recommendation(n, BALANCED, f"draft saturated but N* unknown ({draft})")
        if n_star < n and load.waiting_requests > 0 and not policy.scale_in_while_waiting:
            why = (
                f"draft saturated ({draft}), but {load.waiting_requests} requests wait at the targets: holding"
                " (more drafts serve them; autoscaling.scaleInWhileWaiting would allow fewer targets)"
            )
            return Recommendation(n, BALANCED, why)
        return _tolerant(policy, n, min(n, n_star), SATURATED, f"draft saturated ({draft})")
    saturated = load.waiting_requests > 0 or load.target_occupancy >= policy.saturated_occupancy
    under = load.utilization < policy.underloaded_utilization or (
        load.regime == "UnderLoaded" and load.queue_depth <= 0
    )
    if saturated and under:
        demand = f"{occupancy}, {load.waiting_requests} waiting"
        if n_star is None:
            return Recommendation(n, BALANCED, f"targets saturated ({demand}) but N* unknown")
        why = f"draft under-loaded ({draft}), targets saturated ({demand})"
        return _tolerant(policy, n, max(n, n_star), UNDER_LOADED, why)
    return Recommendation(n, BALANCED, f"{draft}, {occupancy}, {load.waiting_requests} waiting")


def recommend_drafts(policy: Policy, d: int, load: Load) -> Recommendation:
    """The number of drafts one (aggregated) reading argues for, from the current ``d`` (the module's doc)."""
    per = load.per_draft or (load,)
    if len(per) < d:
        return Recommendation(d, BALANCED, f"only {len(per)} of {d} drafts report their load")
    utils = "/".join(f"{x.utilization:.2f}" for x in per)
    occupancy = f"target occupancy {load.target_occupancy:.2f}, {load.waiting_requests} waiting"
    idle = load.target_occupancy < policy.scale_in_occupancy and load.waiting_requests == 0 and load.queue_depth <= 0
    if idle and all(x.utilization < policy.underloaded_utilization for x in per):
        why = f"drafts idle (utilization {utils} < {policy.underloaded_utilization:g}), targets idle ({occupancy})"
        return Recommendation(d - 1, DRAFTS_IDLE, why)
    demand = load.waiting_requests > 0 or load.target_occupancy >= policy.saturated_occupancy
    if demand and all(x.utilization >= policy.saturated_utilization for x in per):
        why = f"every draft saturated (utilization {utils} >= {policy.saturated_utilization:g}), targets have demand"
        return Recommendation(d + 1, DRAFTS_SATURATED, f"{why} ({occupancy})")
    return Recommendation(d, BALANCED, f"draft utilization {utils}, {occupancy}")


def draft_policy(policy: Policy, min_drafts: int, max_drafts: int) -> Policy:
    """The target count's policy turned to the draft count: bounds ``min_drafts..max_drafts``, one draft per
    step, no tolerance band (one draft is a large step); windows, rate limits and thresholds unchanged."""
    if min_drafts < 1 or max_drafts < min_drafts:
        raise ValueError(f"need 1 <= minDrafts <= maxDrafts, got {min_drafts}..{max_drafts}")
    return replace(
        policy,
        min_targets=min_drafts,
        max_targets=max_drafts,
        pool_capacity=(min_drafts, max_drafts),
        tolerance=0.0,
        up=replace(policy.up, max_step=min(1, policy.up.max_step)),
        down=replace(policy.down, max_step=min(1, policy.down.max_step)),
    )


def _tolerant(policy: Policy, n: int, want: int, reason: str, why: str) -> Recommendation:
    if abs(want - n) <= policy.tolerance * n:
        return Recommendation(n, BALANCED, f"{why}, within the {policy.tolerance:g} tolerance of {n}")
    return Recommendation(want, reason, why)


def prune(samples: Sequence[Sample], now: float, keep_seconds: float) -> list[Sample]:
    """The samples :func:`decide` may read: those of the last ``keep_seconds`` and the newest one before them
    (it shows the window is covered)."""
    start = now - keep_seconds
    older = [i for i, s in enumerate(samples) if s.at < start]
    first = older[-1] if older else 0
    return list(samples[first:])


def prune_changes(changes: Sequence[Change], now: float, keep_seconds: float) -> list[Change]:
    return [ch for ch in changes if ch.at >= now - keep_seconds]


def decide(
    policy: Policy,
    *,
    replicas: int,
    ready: int,
    samples: Sequence[Sample],
    now: float,
    changes: Sequence[Change] = (),
    unready_since: float | None = None,
) -> Decision:
    """What to do now. ``replicas`` is ``spec.targets.replicas``, ``ready`` the ready targets, ``samples`` the
    trace so far (oldest first), ``changes`` the recent changes of the count (for the rate limits) and
    ``unready_since`` since when the targets have not all been ready (seconds, same clock; ``None``: now)."""
    return _decide(policy, replicas, ready, samples, now, changes, unready_since, _TARGETS)


def decide_drafts(
    policy: Policy,
    *,
    replicas: int,
    ready: int,
    samples: Sequence[Sample],
    now: float,
    changes: Sequence[Change] = (),
    unready_since: float | None = None,
) -> Decision:
    """:func:`decide` for the number of drafts: ``policy`` from :func:`draft_policy`, ``replicas`` is
    ``spec.draft.replicas``, ``ready`` the ready drafts, ``samples`` carry aggregated readings
    (:func:`aggregate`) and the draft count, ``changes`` the draft count's recent changes."""
    return _decide(policy, replicas, ready, samples, now, changes, unready_since, _DRAFTS)


@dataclass(frozen=True)
class _Count:
    """What a decision moves: its recommendation rule, how messages name it, and its spec field."""

    recommend: Callable[[Policy, int, Load], Recommendation]
    noun: str
    field: str


_TARGETS = _Count(recommend, "targets", "spec.targets.replicas")
_DRAFTS = _Count(recommend_drafts, "drafts", "spec.draft.replicas")


def _decide(
    policy: Policy,
    replicas: int,
    ready: int,
    samples: Sequence[Sample],
    now: float,
    changes: Sequence[Change],
    unready_since: float | None,
    count: _Count,
) -> Decision:
    noun = count.noun

    def hold(reason: str, message: str, timed_out: bool = False) -> Decision:
        return Decision(replicas, replicas, reason, message, timed_out)

    if not policy.enabled:
        return hold(DISABLED, "autoscaling is disabled")
    lo, hi = policy.bounds
    achievable = min(max(replicas, policy.pool_capacity[0]), policy.pool_capacity[1])
    base, timed_out, prefix = replicas, False, ""
    if ready < achievable:
        waited = now - (now if unready_since is None else unready_since)
        if waited < policy.convergence_timeout_seconds:
            return hold(
                NOT_CONVERGED,
                f"waiting for {noun} to settle: {ready} of {achievable} ready"
                f" ({waited:.0f}s of a {policy.convergence_timeout_seconds:.0f}s convergence timeout)",
            )
        base, timed_out = ready, True
        prefix = f"{ready} of {achievable} {noun} ready after {waited:.0f}s, deciding on the ready count: "
    usable = [s for s in samples if not s.load.empty]
    if not samples or samples[-1].load.empty or not usable:
        return hold(NO_METRICS, prefix + "the draft reports no load with a connected target yet", timed_out)

    recs = [(s.at, count.recommend(policy, base, s.load)) for s in usable]
    latest = recs[-1][1]
    up = _window(recs, now, policy.up.window_seconds)
    down = _window(recs, now, policy.down.window_seconds)
    if up is not None and min(r.replicas for r in up) > base:
        direction, chosen = policy.up, min(up, key=lambda r: r.replicas)
    elif down is not None and max(r.replicas for r in down) < base:
        direction, chosen = policy.down, max(down, key=lambda r: r.replicas)
    elif latest.replicas != base:
        window = policy.up if latest.replicas > base else policy.down
        covered = now - usable[0].at
        if covered < window.window_seconds:
            return hold(
                STABILIZING,
                prefix + f"{latest.why}: collecting {covered:.0f}s of a {window.window_seconds:.0f}s window",
                timed_out,
            )
        return hold(STABILIZING, prefix + f"{latest.why}, but not for the whole window", timed_out)
    else:
        return hold(BALANCED, prefix + latest.why, timed_out)

    if direction.select == SELECT_DISABLED:
        kind = "scaleUp" if chosen.replicas > base else "scaleDown"
        return hold(RATE_LIMITED, prefix + f"{chosen.why}, but {kind}.selectPolicy is Disabled", timed_out)
    target = min(max(chosen.replicas, lo), hi)
    target = min(max(target, base - direction.max_step), base + direction.max_step)
    target = _rate_limited(direction, base, target, changes, now)
    if target == replicas:
        if timed_out:
            return hold(BALANCED, prefix + f"{chosen.why}; {count.field} already asks for {replicas}", True)
        if target in (lo, hi):
            return hold(AT_BOUND, prefix + f"{chosen.why}, but {replicas} is at the bound {lo}..{hi}", timed_out)
        return hold(RATE_LIMITED, prefix + f"{chosen.why}, but the rate limit holds it at {replicas}", timed_out)
    message = prefix + f"{replicas} -> {target} {noun}: {chosen.why}"
    return Decision(target, replicas, chosen.reason, message, timed_out)


def _window(recs: Sequence[tuple[float, Recommendation]], now: float, seconds: float) -> list[Recommendation] | None:
    """The recommendations inside the window, or ``None`` while the readings do not span it yet."""
    if recs[0][0] > now - seconds:
        return None
    inside = [r for at, r in recs if at >= now - seconds]
    return inside or [recs[-1][1]]


def _rate_limited(direction: Direction, base: int, target: int, changes: Sequence[Change], now: float) -> int:
    """``target`` capped by the direction's policies, each counted over its period (HPA semantics)."""
    if not direction.policies or target == base:
        return target
    up = target > base
    limits = []
    for p in direction.policies:
        moved = sum(
            (ch.replicas - ch.previous) for ch in changes if ch.at > now - p.period_seconds
        )  # net change within the period
        start = base - moved
        if p.kind == POLICY_PERCENT:
            step = math.ceil(start * p.value / 100) if up else math.floor(start * p.value / 100)
        else:
            step = p.value
        limits.append(start + step if up else start - step)
    pick = max if (direction.select == SELECT_MAX) == up else min
    limit = pick(limits)
    return min(target, max(base, limit)) if up else max(target, min(base, limit))
