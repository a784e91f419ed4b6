"""The rebalancer's decision: how many targets the draft should feed, from its recent load (DESIGN.md §5).

A pure function of a policy, the current target counts and a trace of load samples, so it is tested over
scripted traces with no cluster and no clock.

The rules, each there to keep the count from flapping:

* **Thresholds apart.** A climb starts only while the draft's utilisation is below
  ``underloadedUtilization`` *and* sessions wait for targets (``active_sessions`` above the current count); a
  descent only while utilisation is at or above ``saturatedUtilization`` *and* requests queue at the draft.
  Between the two, hold. A climb, once started, goes on through the band between the thresholds until N* or
  until requests start to queue: the draft's utilisation only reaches 1 at N* itself, so a threshold below 1
  alone would stop every climb short of it.
* **Up toward N\\*, down toward N\\*.** Up to ``min(N*, active_sessions)`` (a target without a session adds
  nothing); down to ``N*``. ``N*`` is the draft's ``recommended_targets``, cross-checked against the system
  model (:func:`starsd.model.optimal_targets`) from the reported times when the draft gives none.
* **Converged first.** No decision while the targets are not all ready at the current count, nor on samples
  that were measured before the count settled (a sample counts once its whole measuring window lies after
  the moment the targets became ready, and after the last rebalance).
* **Stabilisation window.** The fresh samples must span ``stabilizationWindowSeconds``; up takes the
  *smallest* proposal in it and down the *largest*, so a load that swings between both sides holds still.
* **Capped step.** At most ``maxStep`` targets per decision, and never outside ``minTargets..maxTargets``
  nor outside what the pools can hold.
* **No metrics, no action.** An empty window (no timings, no N\\*) holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Reasons a decision changes the count (status.lastRebalance.reason).
UNDER_LOADED = "UnderLoaded"
SATURATED = "Saturated"
# Reasons a decision holds.
DISABLED = "Disabled"
NOT_CONVERGED = "NotConverged"
NO_METRICS = "NoMetrics"
STABILIZING = "Stabilizing"
BALANCED = "Balanced"
AT_BOUND = "AtBound"


@dataclass(frozen=True)
class Load:
    """One reading of the draft's ``/v1/load`` (DESIGN.md section 3)."""

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
        )

    def optimal_targets(self) -> int | None:
        """N*: the draft's own figure, else the system model's from the reported times, else unknown."""
        if self.recommended_targets >= 1:
            return self.recommended_targets
        if self.tq_seconds > 0:
            from starsd import model  # the data plane's model; imported late so the operator starts lean

            return model.optimal_targets(self.tq_seconds, self.tp_seconds, self.tc_seconds)
        return None

    @property
    def empty(self) -> bool:
        """Nothing measured in the window: no draft time, or no N* to steer toward."""
        return self.window_seconds <= 0 or self.tq_seconds <= 0 or self.optimal_targets() is None


@dataclass(frozen=True)
class Sample:
    """A reading taken at ``at`` (seconds) while the cluster had ``replicas`` targets, ``ready`` of them."""

    at: float
    replicas: int
    ready: int
    load: Load


@dataclass(frozen=True)
class Policy:
    enabled: bool
    min_targets: int
    max_targets: int
    underloaded_utilization: float
    saturated_utilization: float
    stabilization_seconds: float
    max_step: int
    pool_capacity: tuple[int, int]  # (sum of pool minimums, sum of pool maximums)

    @property
    def bounds(self) -> tuple[int, int]:
        """The counts the rebalancer may choose: inside both the autoscaling and the pools' bounds."""
        lo = max(self.min_targets, self.pool_capacity[0])
        hi = min(self.max_targets, self.pool_capacity[1])
        return lo, max(lo, hi)


@dataclass(frozen=True)
class Decision:
    replicas: int  # the count to set; the current one when holding
    previous: int
    reason: str
    message: str

    @property
    def changed(self) -> bool:
        return self.replicas != self.previous


def prune(samples: Sequence[Sample], now: float, window: float) -> list[Sample]:
    """Drop what no later decision needs, keeping what :func:`decide` reads: the samples inside the window,
    the newest one before it (it shows the window is covered) and the first of the trailing run at the
    current count (it shows since when the count has been settled)."""
    if not samples:
        return []
    start = now - window
    last = samples[-1]
    run_start = len(samples) - 1
    while run_start > 0 and (samples[run_start - 1].replicas, samples[run_start - 1].ready) == (
        last.replicas,
        last.ready,
    ):
        run_start -= 1
    before = [i for i, s in enumerate(samples) if s.at < start]
    keep = {run_start, *([before[-1]] if before else []), *(i for i, s in enumerate(samples) if s.at >= start)}
    return [samples[i] for i in sorted(keep) if i >= run_start]


def decide(
    policy: Policy,
    *,
    replicas: int,
    ready: int,
    samples: Sequence[Sample],
    now: float,
    last_change: float | None = None,
    climbing: bool = False,
) -> Decision:
    """What to do now. ``replicas`` is ``spec.targets.replicas``, ``ready`` the ready targets, ``samples`` the
    trace so far (oldest first), ``last_change`` when the last rebalance was made (seconds, same clock), and
    ``climbing`` whether that rebalance raised the count to the current one (an unfinished climb)."""

    def hold(reason: str, message: str) -> Decision:
        return Decision(replicas, replicas, reason, message)

    if not policy.enabled:
        return hold(DISABLED, "autoscaling is disabled")
    lo, hi = policy.bounds
    achievable = min(max(replicas, policy.pool_capacity[0]), policy.pool_capacity[1])
    if ready != achievable:
        return hold(NOT_CONVERGED, f"waiting for targets to settle: {ready} of {achievable} ready")
    if not samples or samples[-1].load.empty:
        return hold(NO_METRICS, "the draft reports no measurements yet")

    fresh = _fresh(samples, replicas, achievable, last_change)
    window = policy.stabilization_seconds
    if not fresh or fresh[0].at > now - window:
        covered = now - fresh[0].at if fresh else 0.0
        return hold(
            STABILIZING,
            f"collecting load at {replicas} targets: {covered:.0f}s of a {window:.0f}s window",
        )
    in_window = [s for s in fresh if s.at >= now - window] or [fresh[-1]]
    proposals = [_proposal(policy, replicas, s.load, climbing) for s in in_window]
    up, down = min(proposals), max(proposals)
    latest = in_window[-1].load
    if up > replicas:
        want, reason = up, UNDER_LOADED
        level = (
            f"utilization {latest.utilization:.2f} < {policy.underloaded_utilization:.2f}"
            if latest.utilization < policy.underloaded_utilization
            else f"utilization {latest.utilization:.2f} and no queue, continuing the climb"
        )
        why = (
            f"draft under-loaded ({level}) with {latest.active_sessions} active sessions;"
            f" N* = {latest.optimal_targets()}"
        )
    elif down < replicas:
        want, reason = down, SATURATED
        why = (
            f"draft saturated (utilization {latest.utilization:.2f} >= {policy.saturated_utilization:.2f},"
            f" queue depth {latest.queue_depth:g}); N* = {latest.optimal_targets()}"
        )
    else:
        return hold(BALANCED, f"draft utilization {latest.utilization:.2f}, N* = {latest.optimal_targets()}")
    target = min(max(want, lo), hi)
    target = min(max(target, replicas - policy.max_step), replicas + policy.max_step)
    if target == replicas:
        return hold(AT_BOUND, f"{why}, but {replicas} is at the bound {lo}..{hi}")
    return Decision(target, replicas, reason, f"{replicas} -> {target} targets: {why}")


def _proposal(policy: Policy, replicas: int, load: Load, climbing: bool) -> int:
    """The count one sample alone argues for (``replicas`` when it argues for nothing)."""
    n_star = load.optimal_targets()
    if n_star is None:
        return replicas
    idle = load.utilization < policy.underloaded_utilization or (
        climbing and load.utilization < 1.0 and load.queue_depth <= 0
    )
    if idle and load.active_sessions > replicas:
        return max(replicas, min(n_star, load.active_sessions))
    if load.utilization >= policy.saturated_utilization and load.queue_depth > 0:
        return min(replicas, n_star)
    return replicas


def _fresh(samples: Sequence[Sample], replicas: int, achievable: int, last_change: float | None) -> list[Sample]:
    """The trailing samples taken at the current, settled count whose windows start after it settled."""
    run: list[Sample] = []
    for s in reversed(samples):
        if s.replicas != replicas or s.ready != achievable:
            break
        run.append(s)
    run.reverse()
    if not run:
        return []
    settled = run[0].at if last_change is None else max(run[0].at, last_change)
    return [s for s in run if not s.load.empty and s.at - s.load.window_seconds >= settled]
