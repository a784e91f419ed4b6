"""The rollout decision (rollout.plan): which pool rolls, which are held, when one settles or halts, and the
partition each StatefulSet gets; plus its condition, Events, spec fields and CRD defaults."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from starsd_operator import constants as c
from starsd_operator import podspec, rollout, targets
from starsd_operator.rollout import HALTED, HELD, ROLLING, SETTLED, SETTLING, PoolView, Timing
from starsd_operator.spec import SpecError, parse

from . import factories as f

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()
OLD, NEW = "h-old", "h-new"  # template hashes
TIMING = Timing(now=NOW, min_ready_seconds=0, deadline_seconds=600)


def ts(seconds_ago: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sts(
    pool: str,
    replicas: int,
    *,
    applied: str = OLD,
    current: str = "r1",
    update: str | None = None,
    partition: int = 0,
    observed: bool = True,
    available: int | None = None,
) -> dict[str, Any]:
    """A pool's StatefulSet as listed: the template hash it was applied with, its revisions and partition."""
    return {
        "metadata": {
            "name": f"chat-target-{pool}",
            "generation": 4,
            "annotations": {rollout.ANNOTATION_TEMPLATE_HASH: applied},
        },
        "spec": {"replicas": replicas, "updateStrategy": {"rollingUpdate": {"partition": partition}}},
        "status": {
            "observedGeneration": 4 if observed else 3,
            "replicas": replicas,
            "availableReplicas": replicas if available is None else available,
            "currentRevision": current,
            "updateRevision": update or current,
        },
    }


def pod(
    pool: str,
    ordinal: int,
    revision: str,
    *,
    ready: bool = True,
    since: float = 60,
    **status: Any,
) -> dict[str, Any]:
    """Pod ``ordinal`` of ``pool`` on ``revision``, ready (or not) for ``since`` seconds."""
    return {
        "metadata": {
            "name": f"chat-target-{pool}-{ordinal}",
            "labels": {rollout.REVISION_LABEL: revision},
            "creationTimestamp": ts(since),
        },
        "status": {
            "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": ts(since)}],
            **status,
        },
    }


def view(
    pool: str,
    replicas: int,
    statefulset: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]] = (),
    previous_state: str | None = None,
) -> PoolView:
    """A pool about to be applied with template ``NEW``."""
    return PoolView(pool, replicas, NEW, statefulset, list(pods), previous_state)


def states(plan: list[rollout.PoolRollout]) -> list[tuple[str, str, int]]:
    return [(r.name, r.state, r.partition) for r in plan]


def crash_looping() -> dict[str, Any]:
    return {
        "containerStatuses": [
            {
                "name": "target",
                "ready": False,
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "no config.json in /models/target-v2"}},
            }
        ]
    }


def test_nothing_changed_every_pool_is_settled_at_partition_0() -> None:
    plan = rollout.plan(
        [
            view("h100", 2, sts("h100", 2, applied=NEW), [pod("h100", 0, "r1"), pod("h100", 1, "r1")]),
            view("l4", 1, sts("l4", 1, applied=NEW), [pod("l4", 0, "r1")]),
        ],
        TIMING,
    )
    assert states(plan) == [("h100", SETTLED, 0), ("l4", SETTLED, 0)]
    cond = rollout.condition(plan)
    assert (cond.type, cond.ok, cond.reason) == (c.COND_ROLLOUT_PROGRESSING, True, rollout.REASON_COMPLETE)


def test_a_new_cluster_creates_every_pool_at_once() -> None:
    plan = rollout.plan([view("h100", 2, None), view("l4", 1, None)], TIMING)
    assert states(plan) == [("h100", rollout.CREATING, 0), ("l4", rollout.CREATING, 0)]


def test_a_changed_template_rolls_the_first_pool_from_its_top_pod_and_holds_the_others() -> None:
    # The operator is about to apply a new template (hash NEW) to pools that run OLD.
    plan = rollout.plan(
        [view("h100", 3, sts("h100", 3)), view("l4", 2, sts("l4", 2)), view("a10", 1, sts("a10", 1))], TIMING
    )
    assert states(plan) == [("h100", ROLLING, 2), ("l4", HELD, 2), ("a10", HELD, 1)]
    assert "until pool h100 settles" in plan[1].message
    cond = rollout.condition(plan)
    assert (cond.ok, cond.reason) == (True, rollout.REASON_ROLLING)
    assert "held: l4, a10" in cond.message


def test_the_partition_steps_down_as_updated_pods_become_ready() -> None:
    rolling = sts("h100", 3, applied=NEW, update="r2", partition=2)
    old = [pod("h100", 0, "r1"), pod("h100", 1, "r1")]
    # Pod 2 was replaced and is not ready yet: the partition stays.
    plan = rollout.plan([view("h100", 3, rolling, [*old, pod("h100", 2, "r2", ready=False, since=5)])], TIMING)
    assert states(plan) == [("h100", ROLLING, 2)]
    assert plan[0].revision == "r2" and plan[0].updated == 1
    assert "1 of 3 pods updated" in plan[0].message
    # Pod 2 is ready on r2: pod 1 goes next.
    plan = rollout.plan([view("h100", 3, rolling, [*old, pod("h100", 2, "r2")])], TIMING)
    assert states(plan) == [("h100", ROLLING, 1)]
    # Pods 1 and 2 ready on r2: partition 0.
    pods = [pod("h100", 0, "r1"), pod("h100", 1, "r2"), pod("h100", 2, "r2")]
    plan = rollout.plan([view("h100", 3, sts("h100", 3, applied=NEW, update="r2", partition=1), pods)], TIMING)
    assert states(plan) == [("h100", ROLLING, 0)]


def test_min_ready_seconds_holds_the_next_pod_until_the_updated_one_has_stayed_ready() -> None:
    rolling = sts("h100", 2, applied=NEW, update="r2", partition=1)
    pods = [pod("h100", 0, "r1"), pod("h100", 1, "r2", since=10)]
    strict = Timing(now=NOW, min_ready_seconds=30, deadline_seconds=600)
    assert states(rollout.plan([view("h100", 2, rolling, pods)], strict)) == [("h100", ROLLING, 1)]
    later = Timing(now=NOW + 25, min_ready_seconds=30, deadline_seconds=600)
    assert states(rollout.plan([view("h100", 2, rolling, pods)], later)) == [("h100", ROLLING, 0)]


def test_the_partition_never_rises_while_one_revision_rolls() -> None:
    # The StatefulSet already stands at partition 0 (say the operator restarted after stepping it).
    plan = rollout.plan([view("h100", 3, sts("h100", 3, applied=NEW, update="r2", partition=0), [])], TIMING)
    assert states(plan) == [("h100", ROLLING, 0)]


def test_a_pool_rolls_once_every_earlier_pool_has_settled() -> None:
    done = sts("h100", 2, applied=NEW, current="r2")  # currentRevision == updateRevision
    held = sts("l4", 2, applied=NEW, current="q1", update="q2", partition=2)
    plan = rollout.plan(
        [
            view("h100", 2, done, [pod("h100", 0, "r2"), pod("h100", 1, "r2")], previous_state=ROLLING),
            view("l4", 2, held, [pod("l4", 0, "q1"), pod("l4", 1, "q1")], previous_state=HELD),
        ],
        TIMING,
    )
    assert states(plan) == [("h100", SETTLED, 0), ("l4", ROLLING, 1)]


def test_a_settled_pool_with_pods_not_yet_available_keeps_later_pools_held() -> None:
    settling = sts("h100", 2, applied=NEW, current="r2", available=1)
    later = sts("l4", 1, applied=NEW, current="q1", update="q2", partition=1)
    pods = [pod("h100", 0, "r2", ready=False, since=3), pod("h100", 1, "r2")]
    plan = rollout.plan([view("h100", 2, settling, pods), view("l4", 1, later)], TIMING)
    assert states(plan) == [("h100", SETTLING, 0), ("l4", HELD, 1)]
    # With nothing waiting behind it, the same pool is simply settled.
    alone = rollout.plan([view("h100", 2, settling, pods)], TIMING)
    assert states(alone) == [("h100", SETTLED, 0)]


def test_a_crash_looping_updated_pod_halts_the_pool_and_keeps_the_rest_held() -> None:
    rolling = sts("h100", 3, applied=NEW, update="r2", partition=2)
    pods = [pod("h100", 0, "r1"), pod("h100", 1, "r1"), pod("h100", 2, "r2", ready=False, **crash_looping())]
    held = sts("l4", 1, applied=NEW, current="q1", update="q2", partition=1)
    plan = rollout.plan([view("h100", 3, rolling, pods), view("l4", 1, held, [pod("l4", 0, "q1")])], TIMING)
    # Halted: the partition goes back to the replicas, so no other pod (recreated or added) takes r2.
    assert states(plan) == [("h100", HALTED, 3), ("l4", HELD, 1)]
    cond = rollout.condition(plan)
    assert (cond.ok, cond.reason) == (False, rollout.REASON_HALTED)
    for words in ("pool h100", "revision r2", "chat-target-h100-2", "ContainerFailing", "no config.json", "held: l4"):
        assert words in cond.message


def test_an_updated_pod_not_ready_past_the_deadline_halts_and_one_within_it_does_not() -> None:
    rolling = sts("h100", 2, applied=NEW, update="r2", partition=1)
    late = [pod("h100", 0, "r1"), pod("h100", 1, "r2", ready=False, since=601)]
    plan = rollout.plan([view("h100", 2, rolling, late)], TIMING)
    assert states(plan) == [("h100", HALTED, 2)]
    assert "not ready for 601s (deadline 600s)" in plan[0].message
    early = [pod("h100", 0, "r1"), pod("h100", 1, "r2", ready=False, since=599)]
    assert states(rollout.plan([view("h100", 2, rolling, early)], TIMING)) == [("h100", ROLLING, 1)]


def test_a_pod_still_in_its_startup_budget_is_loading_not_failing() -> None:
    rolling = sts("h100", 1, applied=NEW, update="r2", partition=0)
    loading = pod("h100", 0, "r2", ready=False, since=900, containerStatuses=[{"name": "target", "started": False}])
    assert states(rollout.plan([view("h100", 1, rolling, [loading])], TIMING)) == [("h100", ROLLING, 0)]
    policy = rollout.Policy(progress_deadline_seconds=300)
    assert rollout.effective_deadline(policy, startup_seconds=3600) == 3600
    assert rollout.effective_deadline(policy, startup_seconds=60) == 300


def test_old_pods_failing_do_not_halt_a_rollout() -> None:
    rolling = sts("h100", 2, applied=NEW, update="r2", partition=1)
    pods = [pod("h100", 0, "r1", ready=False, **crash_looping()), pod("h100", 1, "r2", ready=False, since=5)]
    assert states(rollout.plan([view("h100", 2, rolling, pods)], TIMING)) == [("h100", ROLLING, 1)]


def test_a_new_template_resumes_a_halted_pool_from_the_top() -> None:
    halted = sts("h100", 3, applied=OLD, current="r1", update="r2", partition=3)
    pods = [pod("h100", 0, "r1"), pod("h100", 1, "r1"), pod("h100", 2, "r2", ready=False, **crash_looping())]
    plan = rollout.plan([view("h100", 3, halted, pods, previous_state=HALTED), view("l4", 1, sts("l4", 1))], TIMING)
    assert states(plan) == [("h100", ROLLING, 2), ("l4", HELD, 1)]
    [event] = [e for e in rollout.transitions({"h100": HALTED, "l4": HELD}, plan)]
    assert (event.type, event.reason) == ("Normal", c.EVENT_POOL_ROLLING) and "resumed" in event.message


def test_a_failing_pod_that_recovers_lets_the_pool_roll_on() -> None:
    halted = sts("h100", 2, applied=NEW, update="r2", partition=2)
    pods = [pod("h100", 0, "r1"), pod("h100", 1, "r2")]
    assert states(rollout.plan([view("h100", 2, halted, pods, previous_state=HALTED)], TIMING)) == [
        ("h100", ROLLING, 0)
    ]


def test_scaling_up_during_a_rollout_counts_the_new_pods_on_the_new_revision() -> None:
    # Partition 2 of 3 with pod 2 updated; scaled to 5: pods 3 and 4 come up on r2 (above the partition).
    rolling = sts("h100", 5, applied=NEW, update="r2", partition=2)
    pods = [pod("h100", i, "r1") for i in (0, 1)] + [pod("h100", i, "r2") for i in (2, 3, 4)]
    assert states(rollout.plan([view("h100", 5, rolling, pods)], TIMING)) == [("h100", ROLLING, 1)]


def test_scaling_down_during_a_rollout_brings_the_partition_within_the_pods() -> None:
    # Partition 3 of 5 (pods 3, 4 updated); scaled to 2: those pods go, pod 1 is next.
    rolling = sts("h100", 5, applied=NEW, update="r2", partition=3)
    pods = [pod("h100", 0, "r1"), pod("h100", 1, "r1")]
    assert states(rollout.plan([view("h100", 2, rolling, pods)], TIMING)) == [("h100", ROLLING, 1)]
    # Down to none: nothing left to roll.
    assert states(rollout.plan([view("h100", 0, rolling, [])], TIMING)) == [("h100", ROLLING, 0)]


def test_a_held_pool_that_scales_keeps_every_pod_on_its_old_revision() -> None:
    rolling = sts("h100", 2, applied=NEW, update="r2", partition=1)
    plan = rollout.plan(
        [view("h100", 2, rolling), view("l4", 4, sts("l4", 2, applied=NEW, update="q2", partition=2))], TIMING
    )
    assert states(plan) == [("h100", ROLLING, 1), ("l4", HELD, 4)]


def test_a_pool_added_during_a_rollout_is_created_without_waiting_and_blocks_nothing() -> None:
    plan = rollout.plan([view("h100", 2, sts("h100", 2)), view("a10", 1, None), view("l4", 1, sts("l4", 1))], TIMING)
    assert states(plan) == [("h100", ROLLING, 1), ("a10", rollout.CREATING, 0), ("l4", HELD, 1)]
    plan = rollout.plan([view("a10", 1, None), view("l4", 1, sts("l4", 1))], TIMING)
    assert states(plan) == [("a10", rollout.CREATING, 0), ("l4", ROLLING, 0)]


def test_a_pool_removed_during_its_rollout_frees_the_next_one() -> None:
    # h100 was rolling (and left the spec); l4, held behind it, is now first.
    held = sts("l4", 2, applied=NEW, current="q1", update="q2", partition=2)
    plan = rollout.plan([view("l4", 2, held, [pod("l4", 0, "q1"), pod("l4", 1, "q1")], previous_state=HELD)], TIMING)
    assert states(plan) == [("l4", ROLLING, 1)]


def test_a_statefulset_its_controller_has_not_caught_up_with_keeps_its_partition_and_state() -> None:
    stale = sts("h100", 2, applied=NEW, update="r2", partition=1, observed=False)
    behind = sts("l4", 1, applied=NEW, current="q1", update="q2", partition=1)
    plan = rollout.plan([view("h100", 2, stale, previous_state=ROLLING), view("l4", 1, behind)], TIMING)
    assert states(plan) == [("h100", ROLLING, 1), ("l4", HELD, 1)]
    # A settled pool that was only scaled does not hold the pool behind it.
    scaled = sts("h100", 3, applied=NEW, observed=False)
    plan = rollout.plan([view("h100", 3, scaled, previous_state=SETTLED), view("l4", 1, behind)], TIMING)
    assert states(plan) == [("h100", SETTLED, 0), ("l4", ROLLING, 0)]


def test_transitions_post_one_event_per_change_of_state() -> None:
    plan = [
        rollout.PoolRollout("h100", HALTED, 2, "halted at revision r2: ContainerFailing: ...", "r2", 1),
        rollout.PoolRollout("l4", HELD, 1, "held at its current revision until pool h100 settles"),
        rollout.PoolRollout("a10", SETTLED, 0, "every pod runs the pool's latest template", "s2", 1),
    ]
    events = rollout.transitions({"h100": ROLLING, "l4": HELD, "a10": ROLLING}, plan)
    assert [(e.type, e.reason) for e in events] == [
        ("Warning", c.EVENT_POOL_ROLLOUT_HALTED),
        ("Normal", c.EVENT_POOL_ROLLED_OUT),
    ]
    assert "revision s2" in events[1].message
    assert rollout.transitions({"h100": HALTED, "l4": HELD, "a10": SETTLED}, plan) == []
    # A first look at a settled cluster says nothing.
    assert rollout.transitions({}, [plan[2]]) == []


def test_the_template_hash_ignores_key_order_and_sees_every_value() -> None:
    a: dict[str, Any] = {
        "spec": {"containers": [{"name": "target", "image": "x:1"}]},
        "metadata": {"labels": {"a": "1"}},
    }
    b: dict[str, Any] = {
        "metadata": {"labels": {"a": "1"}},
        "spec": {"containers": [{"image": "x:1", "name": "target"}]},
    }
    assert rollout.template_hash(a) == rollout.template_hash(b)
    b["spec"]["containers"][0]["image"] = "x:2"
    assert rollout.template_hash(a) != rollout.template_hash(b)


def test_spec_rollout_defaults_and_bad_values_are_named() -> None:
    parsed = parse(f.spec())
    assert parsed.target.rollout == rollout.Policy(min_ready_seconds=0, progress_deadline_seconds=600)
    custom = parse(f.spec(target={"model": {"path": "/m"}, "rollout": {"minReadySeconds": 30}}))
    assert custom.target.rollout.min_ready_seconds == 30
    for bad, field in (
        ({"progressDeadlineSeconds": 0}, "progressDeadlineSeconds"),
        ({"minReadySeconds": -1}, "minReadySeconds"),
    ):
        with pytest.raises(SpecError, match=rf"spec\.target\.rollout\.{field}"):
            parse(f.spec(target={"model": {"path": "/m"}, "rollout": bad}))
    with pytest.raises(SpecError, match=r"spec\.target\.rollout must be an object"):
        parse(f.spec(target={"model": {"path": "/m"}, "rollout": 5}))


def test_the_statefulset_carries_its_partition_min_ready_and_a_hash_that_only_the_template_moves() -> None:
    spec = parse(f.spec(target={"model": {"path": "/m"}, "rollout": {"minReadySeconds": 15}}))
    pool = spec.pools[0]

    def build(s: Any = spec, replicas: int = 2, partition: int = 0) -> dict[str, Any]:
        return targets.statefulset(f.OWNER, s, pool, replicas, podspec.Images(), partition)

    base = build()
    assert base["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert base["spec"]["minReadySeconds"] == 15
    assert build(partition=1)["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 1

    def hash_of(obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["annotations"][rollout.ANNOTATION_TEMPLATE_HASH])

    assert hash_of(base) == rollout.template_hash(base["spec"]["template"])
    # Scaling and stepping are not template changes; a new model or image is.
    assert hash_of(build(replicas=5, partition=3)) == hash_of(base)
    moved = parse(f.spec(target={"model": {"path": "/m2"}, "rollout": {"minReadySeconds": 15}}))
    assert hash_of(build(moved)) != hash_of(base)
    imaged = parse(f.spec(target={"model": {"path": "/m"}, "image": "r/t:2", "rollout": {"minReadySeconds": 15}}))
    assert hash_of(build(imaged)) != hash_of(base)


def unschedulable(pool: str, ordinal: int, revision: str, *, since: float) -> dict[str, Any]:
    """A Pending pod the scheduler cannot place (no node matches; the cluster autoscaler may add one)."""
    message = "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
    return {
        "metadata": {
            "name": f"chat-target-{pool}-{ordinal}",
            "labels": {rollout.REVISION_LABEL: revision},
            "creationTimestamp": ts(since),
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
        },
    }


def test_an_unschedulable_updated_pod_waits_within_the_deadline_and_halts_past_it() -> None:
    rolling = sts("h100", 2, applied=NEW, update="r2", partition=1)
    waiting = [pod("h100", 0, "r1"), unschedulable("h100", 1, "r2", since=120)]
    plan = rollout.plan([view("h100", 2, rolling, waiting, previous_state=ROLLING)], TIMING)
    assert states(plan) == [("h100", ROLLING, 1)]
    assert "pod chat-target-h100-1 waits to be scheduled (120s of the 600s deadline)" in plan[0].message
    assert rollout.transitions({"h100": ROLLING}, plan) == []  # no Warning while it waits
    late = [pod("h100", 0, "r1"), unschedulable("h100", 1, "r2", since=601)]
    plan = rollout.plan([view("h100", 2, rolling, late, previous_state=ROLLING)], TIMING)
    assert states(plan) == [("h100", HALTED, 2)]
    assert "not ready for 601s (deadline 600s): pod chat-target-h100-1 cannot be scheduled" in plan[0].message
    [warning] = rollout.transitions({"h100": ROLLING}, plan)
    assert warning.type == "Warning"
