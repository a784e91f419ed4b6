"""The rebalancer's control law over traces: scripted ones for each rule, and generated ones (hypothesis) for
the properties the law promises: a signal that alternates faster than the window never changes the count, a
steady signal reaches its target within the window plus one step period per step, bounds always hold."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starsd_operator import rebalancer as rb
from starsd_operator.rebalancer import Change, Decision, Direction, Load, Policy, RatePolicy, Sample

from starsd import system_model

POLICY = Policy(
    enabled=True,
    min_targets=1,
    max_targets=16,
    pool_capacity=(0, 64),
    up=Direction(window_seconds=30.0, max_step=4),
    down=Direction(window_seconds=60.0, max_step=2),
)
INTERVAL = 5.0


def load(
    utilization: float = 0.3,
    *,
    occupancy: float = 0.5,
    waiting: int = 0,
    n_star: int = 7,
    queue: float = 0.0,
    targets: int = 4,
    window: float = 10.0,
    regime: str | None = None,
) -> Load:
    return Load(
        utilization=utilization,
        window_seconds=window,
        tq_seconds=0.004,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=queue,
        targets=targets,
        regime=regime or ("FullyLoaded" if utilization >= 1.0 else "UnderLoaded"),
        active_sessions=0,
        recommended_targets=n_star,
        running_requests=0,
        waiting_requests=waiting,
        target_occupancy=occupancy,
    )


# The three kinds of reading: each argues for one thing whatever the count.
def saturated_targets(n_star: int = 7) -> Load:
    """Draft under-loaded, targets full: up toward N*."""
    return load(0.3, occupancy=0.95, waiting=3, n_star=n_star)


def idle_targets() -> Load:
    """Nothing to do: down toward minTargets."""
    return load(0.05, occupancy=0.02)


def saturated_draft(n_star: int = 3) -> Load:
    """Requests queue at a busy draft: down toward N*."""
    return load(0.99, occupancy=0.5, queue=4, n_star=n_star, regime="FullyLoaded")


def balanced() -> Load:
    return load(0.8, occupancy=0.5, regime="FullyLoaded")


@dataclass
class Run:
    """The operator's loop, ticking every ``interval`` seconds: targets become ready ``settle`` ticks after a
    change (never, with ``stuck`` of them), each tick records a sample, prunes and asks for a decision."""

    policy: Policy
    replicas: int
    trace: Callable[[int, int], Load]  # (tick, replicas) -> what the draft reports
    settle: int = 0
    stuck: int = 0
    interval: float = INTERVAL
    now: float = 1000.0
    samples: list[Sample] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    unready_since: float | None = None
    _since_change: int = 99

    def tick(self, i: int) -> Decision:
        self.now += self.interval
        self._since_change += 1
        achievable = min(max(self.replicas, self.policy.pool_capacity[0]), self.policy.pool_capacity[1])
        ready = achievable if self._since_change >= self.settle else achievable - 1
        ready = max(0, ready - self.stuck)
        if ready >= achievable:
            self.unready_since = None
        elif self.unready_since is None:
            self.unready_since = self.now
        self.samples.append(Sample(self.now, self.replicas, ready, self.trace(i, self.replicas)))
        self.samples = rb.prune(self.samples, self.now, self.policy.history_seconds)
        self.changes = rb.prune_changes(self.changes, self.now, self.policy.history_seconds)
        decision = rb.decide(
            self.policy,
            replicas=self.replicas,
            ready=ready,
            samples=self.samples,
            now=self.now,
            changes=self.changes,
            unready_since=self.unready_since,
        )
        if decision.changed:
            self.changes.append(Change(self.now, decision.previous, decision.replicas))
            self.replicas = decision.replicas
            self._since_change = 0
            self.unready_since = None
        self.history.append(self.replicas)
        self.decisions.append(decision)
        return decision

    def go(self, ticks: int) -> Run:
        for i in range(ticks):
            self.tick(i)
        return self

    @property
    def changed(self) -> list[Decision]:
        return [d for d in self.decisions if d.changed]


def steady(reading: Load) -> Callable[[int, int], Load]:
    return lambda _tick, _n: reading


# --- the rules, one by one -------------------------------------------------------------------------------


def test_saturated_targets_on_an_under_loaded_draft_go_up_to_n_star_in_capped_steps() -> None:
    run = Run(POLICY, replicas=1, trace=steady(saturated_targets(n_star=7)), settle=2).go(60)
    assert [(d.previous, d.replicas) for d in run.changed] == [(1, 5), (5, 7)]
    assert {d.reason for d in run.changed} == {rb.UNDER_LOADED}
    assert run.history[-20:] == [7] * 20


def test_idle_targets_go_down_to_min_targets_even_on_an_under_loaded_draft() -> None:
    run = Run(POLICY, replicas=8, trace=steady(idle_targets()), settle=1).go(60)
    assert [(d.previous, d.replicas) for d in run.changed] == [(8, 6), (6, 4), (4, 2), (2, 1)]
    assert {d.reason for d in run.changed} == {rb.TARGETS_IDLE}
    # Nothing moves before the whole scale-down window (60 s = 12 ticks) has been idle.
    first = next(i for i, d in enumerate(run.decisions) if d.changed)
    assert first == POLICY.down.window_seconds / INTERVAL
    assert run.history[-1] == 1


def test_a_saturated_draft_with_a_queue_goes_down_to_n_star() -> None:
    run = Run(POLICY, replicas=9, trace=steady(saturated_draft(n_star=5)), settle=1).go(60)
    assert [(d.previous, d.replicas) for d in run.changed] == [(9, 7), (7, 5)]
    assert {d.reason for d in run.changed} == {rb.SATURATED}


def test_saturated_targets_do_not_grow_a_saturated_draft() -> None:
    """Targets wait, but because the draft queues: more targets would only queue behind it."""
    reading = load(0.99, occupancy=0.95, waiting=5, queue=3, n_star=6, regime="FullyLoaded")
    run = Run(POLICY, replicas=6, trace=steady(reading)).go(40)
    assert run.changed == []


def test_busy_targets_without_a_waiting_queue_and_below_the_occupancy_threshold_hold() -> None:
    run = Run(POLICY, replicas=4, trace=steady(load(0.3, occupancy=0.5, n_star=9))).go(40)
    assert run.changed == []
    assert run.decisions[-1].reason == rb.BALANCED


def test_the_tolerance_band_holds_small_moves() -> None:
    policy = replace(POLICY, max_targets=40, tolerance=0.1)
    run = Run(policy, replicas=20, trace=steady(saturated_targets(n_star=22))).go(30)
    assert run.changed == []  # 22 is within 10% of 20
    run = Run(policy, replicas=20, trace=steady(saturated_targets(n_star=23))).go(30)
    assert [(d.previous, d.replicas) for d in run.changed] == [(20, 23)]


def test_no_connected_target_is_no_metrics() -> None:
    run = Run(POLICY, replicas=3, trace=steady(load(0.0, occupancy=0.0, targets=0))).go(30)
    assert run.changed == [] and {d.reason for d in run.decisions} == {rb.NO_METRICS}


def test_n_star_unknown_holds_an_up_move() -> None:
    reading = replace(saturated_targets(), recommended_targets=0, tq_seconds=0.0)
    run = Run(POLICY, replicas=3, trace=steady(reading)).go(30)
    assert run.changed == []
    assert "N* unknown" in run.decisions[-1].message


def test_disabled_never_acts() -> None:
    run = Run(replace(POLICY, enabled=False), replicas=1, trace=steady(saturated_targets())).go(40)
    assert run.changed == [] and run.decisions[-1].reason == rb.DISABLED


# --- stabilisation ---------------------------------------------------------------------------------------


def test_a_brief_burst_inside_the_up_window_is_ignored() -> None:
    def burst(tick: int, _n: int) -> Load:
        return saturated_targets(n_star=9) if tick in range(10, 15) else balanced()  # 25 s < the 30 s window

    run = Run(POLICY, replicas=4, trace=burst).go(60)
    assert run.changed == []


def test_a_sustained_burst_is_acted_on_once_the_up_window_is_full() -> None:
    def burst(tick: int, _n: int) -> Load:
        return saturated_targets(n_star=6) if tick >= 10 else balanced()

    run = Run(POLICY, replicas=4, trace=burst).go(40)
    first = next(i for i, d in enumerate(run.decisions) if d.changed)
    assert first == 10 + POLICY.up.window_seconds / INTERVAL
    assert run.history[-1] == 6


def test_after_a_restart_it_waits_a_full_window_before_acting() -> None:
    """Memory is lost on restart: the first samples prove nothing until they span the window."""
    samples = [Sample(100.0 + 5 * i, 5, 5, saturated_targets(n_star=9)) for i in range(3)]
    decision = rb.decide(POLICY, replicas=5, ready=5, samples=samples, now=110.0)
    assert decision.reason == rb.STABILIZING and "collecting 10s of a 30s window" in decision.message


def test_a_zero_window_acts_on_one_reading() -> None:
    policy = replace(POLICY, up=Direction(window_seconds=0.0, max_step=8))
    decision = rb.decide(policy, replicas=2, ready=2, samples=[Sample(20.0, 2, 2, saturated_targets(6))], now=20.0)
    assert (decision.previous, decision.replicas, decision.reason) == (2, 6, rb.UNDER_LOADED)
    assert "2 -> 6 targets" in decision.message and "N* = 6" in decision.message


# --- rate limits and bounds ------------------------------------------------------------------------------


def test_a_pods_policy_limits_the_change_per_period() -> None:
    up = Direction(window_seconds=10.0, max_step=10, policies=(RatePolicy(rb.POLICY_PODS, 2, 60.0),))
    run = Run(replace(POLICY, up=up), replicas=1, trace=steady(saturated_targets(n_star=9))).go(80)
    for d in run.changed:
        i = run.decisions.index(d)
        start = run.now - (len(run.decisions) - 1 - i) * INTERVAL
        recent = [c for c in run.changes if start - 60.0 < c.at <= start]
        assert sum(c.replicas - c.previous for c in recent) <= 2
    assert run.history[-1] == 9
    assert [(d.previous, d.replicas) for d in run.changed][:2] == [(1, 3), (3, 5)]


def test_a_percent_policy_scales_with_the_count() -> None:
    down = Direction(window_seconds=10.0, max_step=100, policies=(RatePolicy(rb.POLICY_PERCENT, 50, 30.0),))
    run = Run(replace(POLICY, down=down, max_targets=40), replicas=40, trace=steady(idle_targets())).go(80)
    assert [(d.previous, d.replicas) for d in run.changed][:3] == [(40, 20), (20, 10), (10, 5)]


def test_select_policy_min_takes_the_smallest_limit() -> None:
    policies = (RatePolicy(rb.POLICY_PODS, 1, 60.0), RatePolicy(rb.POLICY_PERCENT, 100, 60.0))
    up = Direction(window_seconds=0.0, max_step=10, policies=policies, select=rb.SELECT_MIN)
    decision = rb.decide(
        replace(POLICY, up=up), replicas=4, ready=4, samples=[Sample(0.0, 4, 4, saturated_targets(9))], now=0.0
    )
    assert decision.replicas == 5
    decision = rb.decide(
        replace(POLICY, up=replace(up, select=rb.SELECT_MAX)),
        replicas=4,
        ready=4,
        samples=[Sample(0.0, 4, 4, saturated_targets(9))],
        now=0.0,
    )
    assert decision.replicas == 8


def test_select_policy_disabled_never_scales_that_way() -> None:
    down = Direction(window_seconds=10.0, max_step=2, select=rb.SELECT_DISABLED)
    run = Run(replace(POLICY, down=down), replicas=8, trace=steady(idle_targets())).go(40)
    assert run.changed == [] and run.decisions[-1].reason == rb.RATE_LIMITED


@pytest.mark.parametrize(
    ("policy", "start", "reading", "end"),
    [
        (replace(POLICY, max_targets=5), 1, saturated_targets(9), 5),
        (replace(POLICY, min_targets=3), 8, idle_targets(), 3),
        (replace(POLICY, pool_capacity=(0, 3)), 1, saturated_targets(9), 3),
        (replace(POLICY, pool_capacity=(4, 64)), 8, idle_targets(), 4),
    ],
)
def test_bounds_are_respected(policy: Policy, start: int, reading: Load, end: int) -> None:
    run = Run(policy, replicas=start, trace=steady(reading)).go(80)
    lo, hi = policy.bounds
    assert all(lo <= n <= hi for n in run.history)
    assert run.history[-1] == end
    assert run.decisions[-1].reason == rb.AT_BOUND


# --- convergence ----------------------------------------------------------------------------------------


def test_no_decision_while_targets_settle() -> None:
    run = Run(POLICY, replicas=1, trace=steady(saturated_targets(n_star=9)), settle=4).go(40)
    first, second = [i for i, d in enumerate(run.decisions) if d.changed][:2]
    assert {d.reason for d in run.decisions[first + 1 : first + 4]} == {rb.NOT_CONVERGED}
    assert second == first + 4


def test_a_target_that_never_becomes_ready_blocks_until_the_convergence_timeout() -> None:
    policy = replace(POLICY, convergence_timeout_seconds=120.0)
    run = Run(policy, replicas=6, trace=steady(idle_targets()), stuck=1).go(60)
    first = next(i for i, d in enumerate(run.decisions) if d.changed)
    assert {d.reason for d in run.decisions[: first - 1]} == {rb.NOT_CONVERGED}
    assert first == 120.0 / INTERVAL
    decision = run.decisions[first]
    # On the ready count (5), two down per step: 6 -> 3.
    assert (decision.previous, decision.replicas, decision.timed_out) == (6, 3, True)
    assert "5 of 6 targets ready after 120s, deciding on the ready count" in decision.message


def test_the_timeout_restarts_after_each_change() -> None:
    policy = replace(POLICY, convergence_timeout_seconds=60.0)
    run = Run(policy, replicas=8, trace=steady(idle_targets()), stuck=1).go(60)
    steps = [i for i, d in enumerate(run.decisions) if d.changed]
    assert all(b - a >= 60.0 / INTERVAL for a, b in itertools.pairwise(steps))


# --- properties over generated traces ---------------------------------------------------------------------

windows = st.integers(min_value=1, max_value=12).map(lambda k: k * INTERVAL)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    lo = draw(st.integers(min_value=0, max_value=6))
    hi = draw(st.integers(min_value=max(lo, 1), max_value=24))
    return replace(
        POLICY,
        min_targets=lo,
        max_targets=hi,
        tolerance=0.0,
        up=Direction(window_seconds=draw(windows), max_step=draw(st.integers(min_value=1, max_value=6))),
        down=Direction(window_seconds=draw(windows), max_step=draw(st.integers(min_value=1, max_value=6))),
    )


@settings(max_examples=150, deadline=None)
@given(
    policy=policies(),
    start=st.integers(min_value=0, max_value=24),
    data=st.data(),
)
def test_a_signal_alternating_faster_than_the_window_never_changes_the_count(
    policy: Policy, start: int, data: st.DataObject
) -> None:
    lo, hi = policy.bounds
    start = min(max(start, lo), hi)
    # Each run of one kind lasts at most as many ticks as the shorter window holds readings minus one, so
    # every window sees both kinds; the kinds alternate: one that argues up, then one that does not.
    longest = int(min(policy.up.window_seconds, policy.down.window_seconds) // INTERVAL)
    runs = data.draw(st.lists(st.integers(min_value=1, max_value=longest), min_size=4, max_size=30))
    n_star = data.draw(st.integers(min_value=start + 1, max_value=40))
    others = data.draw(st.lists(st.sampled_from(["idle", "draft", "balanced"]), min_size=len(runs), max_size=len(runs)))
    trace: list[Load] = []
    for i, length in enumerate(runs):
        if i % 2 == 0:
            reading = saturated_targets(n_star=n_star)
        else:
            reading = {"idle": idle_targets(), "draft": saturated_draft(n_star=1), "balanced": balanced()}[others[i]]
        trace += [reading] * length
    run = Run(policy, replicas=start, trace=lambda tick, _n: trace[tick]).go(len(trace))
    assert run.changed == [], [(d.previous, d.replicas, d.message) for d in run.changed]


@settings(max_examples=150, deadline=None)
@given(policy=policies(), start=st.integers(min_value=0, max_value=24), kind=st.sampled_from(["up", "idle", "draft"]))
def test_a_steady_signal_reaches_its_target_within_the_window_plus_one_period_per_step(
    policy: Policy, start: int, kind: str
) -> None:
    lo, hi = policy.bounds
    start = min(max(start, lo), hi)
    n_star = 1 + (start * 7 + 3) % 30
    reading = {"up": saturated_targets(n_star), "idle": idle_targets(), "draft": saturated_draft(n_star)}[kind]
    goal = {"up": max(start, n_star), "idle": lo, "draft": min(start, n_star)}[kind]
    goal = min(max(goal, lo), hi) if goal != start else start
    direction = policy.up if goal > start else policy.down
    steps = math.ceil(abs(goal - start) / direction.max_step)
    run = Run(policy, replicas=start, trace=steady(reading)).go(
        int((direction.window_seconds + 40 * INTERVAL) / INTERVAL)
    )
    assert run.history[-1] == goal
    if steps:
        reached = next(i for i, n in enumerate(run.history) if n == goal)
        # Readings start at tick 0 (t = INTERVAL); the window is full W seconds later, then one step a tick.
        assert reached * INTERVAL <= direction.window_seconds + steps * INTERVAL
    assert all(abs(d.replicas - d.previous) <= direction.max_step for d in run.changed)


def any_load() -> st.SearchStrategy[Load]:
    return st.builds(
        load,
        st.floats(min_value=0.0, max_value=1.0),
        occupancy=st.floats(min_value=0.0, max_value=1.0),
        waiting=st.integers(min_value=0, max_value=20),
        n_star=st.integers(min_value=0, max_value=80),
        queue=st.floats(min_value=0.0, max_value=10.0),
        targets=st.integers(min_value=0, max_value=30),
    )


@settings(max_examples=150, deadline=None)
@given(
    policy=policies(),
    start=st.integers(min_value=0, max_value=24),
    trace=st.lists(any_load(), min_size=1, max_size=60),
    pools=st.tuples(st.integers(min_value=0, max_value=4), st.integers(min_value=4, max_value=30)),
    settle=st.integers(min_value=0, max_value=3),
)
def test_bounds_always_hold(policy: Policy, start: int, trace: list[Load], pools: tuple[int, int], settle: int) -> None:
    policy = replace(policy, pool_capacity=pools, convergence_timeout_seconds=20.0)
    lo, hi = policy.bounds
    start = min(max(start, lo), hi)
    run = Run(policy, replicas=start, trace=lambda tick, _n: trace[tick % len(trace)], settle=settle).go(120)
    assert all(lo <= n <= hi for n in run.history)
    assert all(abs(d.replicas - d.previous) <= max(policy.up.max_step, policy.down.max_step) for d in run.changed)


# --- the reading itself ---------------------------------------------------------------------------------


def test_the_demand_fields_are_read_and_default_to_zero() -> None:
    data = {"utilization": 0.3, "window_seconds": 10, "targets": 2}
    assert (Load.from_json(data).running_requests, Load.from_json(data).target_occupancy) == (0, 0.0)
    full = Load.from_json({**data, "running_requests": 12, "waiting_requests": 3, "target_occupancy": 0.75})
    assert (full.running_requests, full.waiting_requests, full.target_occupancy) == (12, 3, 0.75)


def test_n_star_falls_back_to_the_system_model() -> None:
    data = {
        "utilization": 0.3,
        "window_seconds": 10,
        "tq_seconds": 0.004,
        "tp_seconds": 0.02,
        "tc_seconds": 0.001,
        "recommended_targets": 0,
        "targets": 1,
    }
    assert Load.from_json(data).optimal_targets() == system_model.optimal_targets(0.004, 0.02, 0.001) == 7
    assert Load.from_json({**data, "recommended_targets": 9}).optimal_targets() == 9
    assert Load.from_json({**data, "tq_seconds": 0, "recommended_targets": 0}).optimal_targets() is None
    assert Load.from_json({**data, "targets": 0}).empty


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"utilization": "high", "window_seconds": 10},
        {"utilization": 0.5, "window_seconds": -1},
        {"utilization": 0.5, "window_seconds": 10, "queue_depth": float("nan")},
        {"utilization": 0.5, "window_seconds": 10, "regime": 3},
        {"utilization": True, "window_seconds": 10},
        {"utilization": 0.5, "window_seconds": 10, "waiting_requests": -1},
        {"utilization": 0.5, "window_seconds": 10, "target_occupancy": "full"},
    ],
)
def test_malformed_load_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Load.from_json(bad)


def test_a_saturated_draft_keeps_targets_that_have_requests_waiting() -> None:
    """recommend(n=8, utilisation .95, queue 3, waiting 50, occupancy 1.0) held: those clients need the targets."""
    reading = load(0.95, occupancy=1.0, waiting=50, queue=3, n_star=4, regime="FullyLoaded")
    rec = rb.recommend(POLICY, 8, reading)
    assert (rec.replicas, rec.reason) == (8, rb.BALANCED)
    assert "50 requests wait at the targets" in rec.why and "scaleInWhileWaiting" in rec.why
    run = Run(POLICY, replicas=8, trace=steady(reading), settle=1).go(120)
    assert run.changed == []


def test_a_saturated_draft_removes_waiting_targets_only_when_the_user_opts_in() -> None:
    reading = load(0.95, occupancy=1.0, waiting=50, queue=3, n_star=4, regime="FullyLoaded")
    opted = replace(POLICY, scale_in_while_waiting=True)
    assert rb.recommend(opted, 8, reading) == rb.Recommendation(4, rb.SATURATED, rb.recommend(opted, 8, reading).why)
    run = Run(opted, replicas=8, trace=steady(reading), settle=1).go(120)
    assert [(d.previous, d.replicas) for d in run.changed] == [(8, 6), (6, 4)]
