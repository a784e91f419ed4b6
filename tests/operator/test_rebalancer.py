"""The rebalancer's decision over scripted load traces: it converges to N* from below and from above, holds
still on a load that swings, respects every bound, skips empty metrics, waits for convergence and for its
stabilisation window, and never moves more than its step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from starsd_operator import rebalancer as rb
from starsd_operator.rebalancer import Decision, Load, Policy, Sample

from starsd import model

POLICY = Policy(
    enabled=True,
    min_targets=1,
    max_targets=16,
    underloaded_utilization=0.7,
    saturated_utilization=0.9,
    stabilization_seconds=30.0,
    max_step=4,
    pool_capacity=(0, 64),
)
INTERVAL = 5.0


def load(
    utilization: float,
    *,
    sessions: int = 0,
    n_star: int = 7,
    queue: float = 0.0,
    window: float = 10.0,
    tq: float = 0.004,
) -> Load:
    return Load(
        utilization=utilization,
        window_seconds=window,
        tq_seconds=tq,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=queue,
        targets=0,
        regime="FullyLoaded" if utilization >= 1.0 else "UnderLoaded",
        active_sessions=sessions,
        recommended_targets=n_star,
    )


@dataclass(frozen=True)
class Star:
    """A draft with N targets, as the system model says it behaves (DESIGN.md section 2)."""

    tq: float = 0.004
    tp: float = 0.02
    tc: float = 0.001
    sessions: int = 40

    @property
    def n_star(self) -> int:
        return model.optimal_targets(self.tq, self.tp, self.tc)

    def __call__(self, n: int) -> Load:
        rho = model.utilization(max(n, 1), self.tq, self.tp, self.tc)
        return load(rho, sessions=self.sessions, n_star=self.n_star, queue=max(0, n - self.n_star), tq=self.tq)


@dataclass
class Run:
    """The operator's loop, ticking every INTERVAL seconds: targets become ready ``settle`` ticks after a
    change, each tick records a sample, prunes the trace and asks for a decision."""

    policy: Policy
    replicas: int
    trace: Callable[[int, int], Load]  # (tick, replicas) -> what the draft reports
    settle: int = 2
    now: float = 1000.0
    samples: list[Sample] = field(default_factory=list)
    history: list[int] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    last_change: float | None = None
    climbing: bool = False
    _since_change: int = 99

    def tick(self, i: int) -> Decision:
        self.now += INTERVAL
        self._since_change += 1
        achievable = min(max(self.replicas, self.policy.pool_capacity[0]), self.policy.pool_capacity[1])
        ready = achievable if self._since_change >= self.settle else achievable - 1
        self.samples.append(Sample(self.now, self.replicas, ready, self.trace(i, self.replicas)))
        self.samples = rb.prune(self.samples, self.now, self.policy.stabilization_seconds)
        decision = rb.decide(
            self.policy,
            replicas=self.replicas,
            ready=ready,
            samples=self.samples,
            now=self.now,
            last_change=self.last_change,
            climbing=self.climbing,
        )
        if decision.changed:
            self.climbing = decision.replicas > decision.previous
            self.replicas = decision.replicas
            self.last_change = self.now
            self._since_change = 0
        self.history.append(self.replicas)
        self.decisions.append(decision)
        return decision

    def go(self, ticks: int) -> Run:
        for i in range(ticks):
            self.tick(i)
        return self

    @property
    def changes(self) -> list[Decision]:
        return [d for d in self.decisions if d.changed]


def star_trace(star: Star) -> Callable[[int, int], Load]:
    return lambda _tick, n: star(n)


def test_the_emulated_star_has_n_star_seven() -> None:
    assert Star().n_star == 7  # ceil(1 + (0.02 + 2*0.001) / 0.004)


def test_converges_to_n_star_from_below_and_stays() -> None:
    run = Run(POLICY, replicas=1, trace=star_trace(Star())).go(80)
    assert run.history[-1] == 7
    assert [(d.previous, d.replicas) for d in run.changes] == [(1, 5), (5, 7)]
    assert all(d.reason == rb.UNDER_LOADED for d in run.changes)
    assert run.history[-30:] == [7] * 30


def test_converges_to_n_star_from_above_and_stays() -> None:
    run = Run(POLICY, replicas=16, trace=star_trace(Star())).go(80)
    assert [(d.previous, d.replicas) for d in run.changes] == [(16, 12), (12, 8), (8, 7)]
    assert all(d.reason == rb.SATURATED for d in run.changes)
    assert run.history[-30:] == [7] * 30


def test_a_climb_does_not_start_between_the_thresholds() -> None:
    """At 5 targets the emulated draft is 77% busy: below N* = 7, but not under-loaded enough to start."""
    run = Run(POLICY, replicas=5, trace=star_trace(Star())).go(60)
    assert run.changes == []
    assert run.decisions[-1].reason == rb.BALANCED


def test_a_climb_stops_when_requests_start_to_queue() -> None:
    def queueing(_tick: int, n: int) -> Load:
        return load(0.8, sessions=40, n_star=9, queue=0 if n < 6 else 2)

    run = Run(replace(POLICY, max_step=1), replicas=5, trace=queueing, climbing=True).go(60)
    assert run.history[-1] == 6


def test_every_step_is_capped() -> None:
    star = Star(tq=0.001, tp=0.03, tc=0.001)  # N* = 33
    run = Run(replace(POLICY, max_targets=40, max_step=3), replicas=1, trace=star_trace(star)).go(200)
    assert all(abs(d.replicas - d.previous) <= 3 for d in run.changes)
    assert run.history[-1] == 33


def test_up_stops_at_the_active_sessions() -> None:
    """A target without a session adds nothing: with 4 sessions, 4 targets are enough."""
    run = Run(POLICY, replicas=1, trace=star_trace(Star(sessions=4))).go(60)
    assert run.history[-1] == 4


def test_no_demand_no_scale_up() -> None:
    run = Run(POLICY, replicas=3, trace=lambda _t, n: load(0.2, sessions=n, n_star=9)).go(40)
    assert run.changes == []
    assert run.decisions[-1].reason == rb.BALANCED


@pytest.mark.parametrize(
    ("policy", "start", "end"),
    [
        (replace(POLICY, max_targets=5), 1, 5),
        (replace(POLICY, min_targets=9), 16, 9),
        (replace(POLICY, pool_capacity=(0, 3)), 1, 3),
        (replace(POLICY, pool_capacity=(10, 64)), 16, 10),
    ],
)
def test_bounds_are_respected(policy: Policy, start: int, end: int) -> None:
    run = Run(policy, replicas=start, trace=star_trace(Star())).go(80)
    lo, hi = policy.bounds
    assert all(lo <= n <= hi for n in run.history)
    assert run.history[-1] == end
    assert run.decisions[-1].reason == rb.AT_BOUND


def test_holds_still_on_a_load_that_swings_between_both_sides() -> None:
    def swinging(tick: int, _n: int) -> Load:
        if tick % 2:
            return load(0.99, queue=3, n_star=3)  # saturated: argues for 3
        return load(0.3, sessions=20, n_star=9)  # under-loaded: argues for 9

    run = Run(POLICY, replicas=5, trace=swinging).go(100)
    assert run.changes == []
    assert set(run.history) == {5}


def test_holds_between_the_thresholds() -> None:
    run = Run(POLICY, replicas=5, trace=lambda _t, _n: load(0.8, sessions=20, n_star=9, queue=2)).go(40)
    assert run.changes == []
    assert run.decisions[-1].reason == rb.BALANCED


def test_a_brief_dip_inside_the_window_is_ignored() -> None:
    def dip(tick: int, n: int) -> Load:
        return load(0.3, sessions=20, n_star=9) if tick in (10, 11) else load(0.8, n_star=n)

    run = Run(POLICY, replicas=5, trace=dip).go(40)
    assert run.changes == []


def test_a_sustained_change_is_acted_on_after_the_window() -> None:
    def step_up(tick: int, n: int) -> Load:
        return load(0.3, sessions=20, n_star=9) if tick >= 10 else load(0.8, n_star=n)

    run = Run(POLICY, replicas=5, trace=step_up).go(40)
    first = next(i for i, d in enumerate(run.decisions) if d.changed)
    # The under-loaded readings start at tick 10; 30 s of them (six ticks) must be in before acting.
    assert first >= 10 + POLICY.stabilization_seconds / INTERVAL
    assert run.history[-1] == 9


def test_empty_metrics_are_skipped() -> None:
    run = Run(POLICY, replicas=2, trace=lambda _t, _n: load(0.0, sessions=10, tq=0.0, n_star=0)).go(30)
    assert run.changes == []
    assert {d.reason for d in run.decisions} == {rb.NO_METRICS}


def test_an_empty_window_in_the_middle_holds_and_restarts_the_window() -> None:
    def gap(tick: int, n: int) -> Load:
        return load(0.0, tq=0.0, n_star=0) if tick == 12 else load(0.3, sessions=20, n_star=9)

    run = Run(replace(POLICY, max_step=8), replicas=5, trace=gap).go(40)
    assert run.decisions[12].reason == rb.NO_METRICS
    assert run.history[-1] == 9


def test_no_decision_until_the_targets_are_ready() -> None:
    decision = rb.decide(
        POLICY,
        replicas=5,
        ready=3,
        samples=[Sample(t, 5, 3, load(0.2, sessions=30, n_star=9)) for t in range(0, 100, 5)],
        now=100.0,
    )
    assert not decision.changed and decision.reason == rb.NOT_CONVERGED


def test_after_a_change_it_waits_for_readings_of_the_new_count() -> None:
    run = Run(POLICY, replicas=1, trace=star_trace(Star()), settle=3).go(80)
    first, second = [i for i, d in enumerate(run.decisions) if d.changed]
    # settle (3 ticks) + the draft's 10 s window (2 ticks) + the 30 s stabilisation window (6 ticks).
    assert second - first >= 3 + 2 + 6
    assert {d.reason for d in run.decisions[first + 1 : first + 3]} == {rb.NOT_CONVERGED}


def test_after_a_restart_it_waits_a_full_window_before_acting() -> None:
    """Memory is lost on restart: the first samples prove nothing until they span the window."""
    samples = [Sample(100.0 + 5 * i, 5, 5, load(0.2, sessions=30, n_star=9)) for i in range(3)]
    decision = rb.decide(POLICY, replicas=5, ready=5, samples=samples, now=110.0, last_change=50.0)
    assert decision.reason == rb.STABILIZING


def test_samples_at_another_count_do_not_count() -> None:
    """A manual `kubectl scale` in between: readings taken at the old count are not evidence."""
    old = [Sample(float(t), 3, 3, load(0.2, sessions=30, n_star=9)) for t in range(0, 60, 5)]
    new = [Sample(60.0, 5, 5, load(0.2, sessions=30, n_star=9))]
    decision = rb.decide(POLICY, replicas=5, ready=5, samples=old + new, now=60.0)
    assert decision.reason == rb.STABILIZING


def test_a_zero_window_acts_on_one_fresh_reading() -> None:
    policy = replace(POLICY, stabilization_seconds=0.0)
    reading = load(0.2, sessions=30, n_star=6)
    samples = [Sample(0.0, 2, 2, reading), Sample(20.0, 2, 2, reading)]
    decision = rb.decide(policy, replicas=2, ready=2, samples=samples, now=20.0)
    assert (decision.previous, decision.replicas, decision.reason) == (2, 6, rb.UNDER_LOADED)
    assert "2 -> 6 targets" in decision.message and "N* = 6" in decision.message


def test_disabled_never_acts() -> None:
    run = Run(replace(POLICY, enabled=False), replicas=1, trace=star_trace(Star())).go(40)
    assert run.changes == [] and run.decisions[-1].reason == rb.DISABLED


def test_prune_keeps_what_a_long_steady_run_needs() -> None:
    run = Run(POLICY, replicas=7, trace=star_trace(Star())).go(500)
    assert len(run.samples) <= POLICY.stabilization_seconds / INTERVAL + 3
    # After many pruned ticks an under-loaded reading still gets decided on.
    steady = star_trace(Star())

    def then_idle(tick: int, n: int) -> Load:
        return steady(tick, n) if tick < 300 else load(0.2, sessions=40, n_star=9)

    later = Run(POLICY, replicas=7, trace=then_idle).go(340)
    assert later.history[-1] == 9


def test_n_star_falls_back_to_the_system_model() -> None:
    data = {
        "utilization": 0.3,
        "window_seconds": 10,
        "tq_seconds": 0.004,
        "tp_seconds": 0.02,
        "tc_seconds": 0.001,
        "recommended_targets": 0,
    }
    assert Load.from_json(data).optimal_targets() == model.optimal_targets(0.004, 0.02, 0.001) == 7
    assert Load.from_json({**data, "recommended_targets": 9}).optimal_targets() == 9
    assert Load.from_json({**data, "tq_seconds": 0, "recommended_targets": 0}).empty


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"utilization": "high", "window_seconds": 10},
        {"utilization": 0.5, "window_seconds": -1},
        {"utilization": 0.5, "window_seconds": 10, "queue_depth": float("nan")},
        {"utilization": 0.5, "window_seconds": 10, "regime": 3},
        {"utilization": True, "window_seconds": 10},
    ],
)
def test_malformed_load_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Load.from_json(bad)
