"""The draft count's decisions (rebalancer.recommend_drafts / decide_drafts) and the aggregation of several
drafts' readings (rebalancer.aggregate), over generated traces with no cluster and no clock."""

from __future__ import annotations

import pytest
from starsd_operator import rebalancer as rb
from starsd_operator.rebalancer import Change, Direction, Load, Policy, RatePolicy, Sample

BASE = Policy(
    enabled=True,
    min_targets=1,
    max_targets=64,
    pool_capacity=(0, 1000),
    up=Direction(window_seconds=30.0, max_step=4),
    down=Direction(window_seconds=120.0, max_step=2),
)


def reading(util: float, *, occupancy: float = 0.5, waiting: int = 0, queue: float = 0.0, targets: int = 3) -> Load:
    return Load(
        utilization=util,
        window_seconds=10.0,
        tq_seconds=0.004,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=queue,
        targets=targets,
        regime="FullyLoaded" if util >= 0.99 else "UnderLoaded",
        active_sessions=targets,
        recommended_targets=7,
        waiting_requests=waiting,
        target_occupancy=occupancy,
    )


def saturated(d: int) -> Load:
    return rb.aggregate([reading(0.97, occupancy=0.9, waiting=2, queue=1.0) for _ in range(d)])


def idle(d: int) -> Load:
    return rb.aggregate([reading(0.1, occupancy=0.0) for _ in range(d)])


def trace(load: Load, replicas: int, seconds: float, step: float = 5.0) -> list[Sample]:
    return [Sample(at=t * step, replicas=replicas, ready=replicas, load=load) for t in range(int(seconds / step) + 1)]


def decide(policy: Policy, replicas: int, samples: list[Sample], **kw: object) -> rb.Decision:
    return rb.decide_drafts(
        policy, replicas=replicas, ready=kw.pop("ready", replicas), samples=samples, now=samples[-1].at, **kw
    )  # type: ignore[arg-type]


# --- aggregation ----------------------------------------------------------------------------------


def test_aggregate_takes_the_worst_draft_and_the_total_demand() -> None:
    a = reading(0.4, occupancy=0.2, waiting=1, queue=0.0, targets=2)
    b = reading(0.95, occupancy=0.8, waiting=3, queue=2.0, targets=6)
    agg = rb.aggregate([a, b])
    assert agg.utilization == 0.95 and agg.regime == b.regime
    assert agg.targets == 8 and agg.waiting_requests == 4 and agg.queue_depth == 2.0
    assert agg.target_occupancy == pytest.approx((0.2 * 2 + 0.8 * 6) / 8)
    assert agg.optimal_targets() == 14  # D drafts keep D * N* targets busy
    assert agg.per_draft == (a, b)


def test_a_draft_without_n_star_counts_as_the_others_mean() -> None:
    unknown = Load(
        utilization=0.0,
        window_seconds=10.0,
        tq_seconds=0.0,
        tp_seconds=0.0,
        tc_seconds=0.0,
        queue_depth=0.0,
        targets=0,
        regime="",
        active_sessions=0,
        recommended_targets=0,
    )
    assert rb.aggregate([reading(0.5), unknown, reading(0.5)]).optimal_targets() == 21
    assert rb.aggregate([unknown]).optimal_targets() is None
    with pytest.raises(ValueError):
        rb.aggregate([])


# --- recommendations ------------------------------------------------------------------------------


def test_every_draft_saturated_with_demand_asks_for_one_more_draft() -> None:
    rec = rb.recommend_drafts(BASE, 2, saturated(2))
    assert (rec.replicas, rec.reason) == (3, rb.DRAFTS_SATURATED)


def test_one_draft_with_room_holds_the_count() -> None:
    mixed = rb.aggregate([reading(0.97, occupancy=0.9, waiting=2), reading(0.5, occupancy=0.9, waiting=2)])
    assert rb.recommend_drafts(BASE, 2, mixed).replicas == 2


def test_saturated_drafts_without_demand_hold() -> None:
    busy_no_demand = rb.aggregate([reading(0.97, occupancy=0.5) for _ in range(2)])
    assert rb.recommend_drafts(BASE, 2, busy_no_demand).replicas == 2


def test_idle_drafts_and_targets_ask_for_one_fewer() -> None:
    rec = rb.recommend_drafts(BASE, 3, idle(3))
    assert (rec.replicas, rec.reason) == (2, rb.DRAFTS_IDLE)
    busy_targets = rb.aggregate([reading(0.1, occupancy=0.5) for _ in range(3)])
    assert rb.recommend_drafts(BASE, 3, busy_targets).replicas == 3


def test_a_draft_that_does_not_report_holds_the_count() -> None:
    rec = rb.recommend_drafts(BASE, 3, saturated(2))
    assert rec.replicas == 3 and "2 of 3" in rec.why


# --- decisions: bounds, windows, rate limits ------------------------------------------------------


def test_adds_a_draft_once_the_up_window_is_full_and_records_why() -> None:
    pol = rb.draft_policy(BASE, 1, 4)
    early = decide(pol, 2, trace(saturated(2), 2, 20))
    assert not early.changed and early.reason == rb.STABILIZING
    d = decide(pol, 2, trace(saturated(2), 2, 30))
    assert (d.previous, d.replicas, d.reason) == (2, 3, rb.DRAFTS_SATURATED)
    assert d.message.startswith("2 -> 3 drafts: every draft saturated")


def test_one_draft_per_step_whatever_the_target_step() -> None:
    pol = rb.draft_policy(BASE, 1, 10)
    assert pol.up.max_step == 1 and pol.down.max_step == 1 and pol.tolerance == 0.0
    assert decide(pol, 1, trace(saturated(1), 1, 30)).replicas == 2


def test_removes_a_draft_after_the_down_window_down_to_min_drafts() -> None:
    pol = rb.draft_policy(BASE, 2, 4)
    assert not decide(pol, 3, trace(idle(3), 3, 60)).changed  # the 120 s window is not full yet
    d = decide(pol, 3, trace(idle(3), 3, 120))
    assert (d.replicas, d.reason) == (2, rb.DRAFTS_IDLE)
    at_min = decide(pol, 2, trace(idle(2), 2, 120))
    assert not at_min.changed and at_min.reason == rb.AT_BOUND


def test_max_drafts_bounds_the_count() -> None:
    pol = rb.draft_policy(BASE, 1, 2)
    d = decide(pol, 2, trace(saturated(2), 2, 30))
    assert not d.changed and d.reason == rb.AT_BOUND


def test_a_swinging_signal_never_moves_the_count() -> None:
    pol = rb.draft_policy(BASE, 1, 4)
    samples = [Sample(at=t * 5.0, replicas=2, ready=2, load=saturated(2) if t % 2 else idle(2)) for t in range(40)]
    assert not decide(pol, 2, samples).changed


def test_rate_limit_counts_the_recent_changes() -> None:
    limited = Direction(window_seconds=30.0, max_step=4, policies=(RatePolicy(rb.POLICY_PODS, 1, 600.0),))
    pol = rb.draft_policy(Policy(**{**BASE.__dict__, "up": limited}), 1, 8)
    samples = trace(saturated(3), 3, 30)
    recent = [Change(at=samples[-1].at - 10.0, previous=2, replicas=3)]
    d = decide(pol, 3, samples, changes=recent)
    assert not d.changed and d.reason == rb.RATE_LIMITED
    assert decide(pol, 3, samples).replicas == 4  # without the recent change it moves


def test_waits_for_new_drafts_to_be_ready() -> None:
    pol = rb.draft_policy(BASE, 1, 4)
    d = decide(pol, 3, trace(saturated(2), 3, 30), ready=2)
    assert not d.changed and d.reason == rb.NOT_CONVERGED
    assert "waiting for drafts to settle: 2 of 3 ready" in d.message


def test_disabled_autoscaling_never_moves_drafts() -> None:
    pol = rb.draft_policy(Policy(**{**BASE.__dict__, "enabled": False}), 1, 4)
    assert decide(pol, 2, trace(saturated(2), 2, 60)).reason == rb.DISABLED


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="minDrafts"):
        rb.draft_policy(BASE, 0, 2)
    with pytest.raises(ValueError, match="minDrafts"):
        rb.draft_policy(BASE, 3, 2)
