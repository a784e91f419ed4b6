"""The status aggregated from the children and the draft's load, and its merge patch."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from starsd_operator import constants as c
from starsd_operator import status
from starsd_operator.rebalancer import NOT_CONVERGED, Decision, Load
from starsd_operator.spec import parse

from . import factories as f
from .test_diagnose import MISSING_MODEL, crashing

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LOAD = Load(
    utilization=0.4234,
    window_seconds=10,
    tq_seconds=0.004,
    tp_seconds=0.02,
    tc_seconds=0.001,
    queue_depth=0,
    targets=3,
    regime="UnderLoaded",
    active_sessions=12,
    recommended_targets=7,
)


def healthy(replicas: int = 3) -> status.Children:
    # spec(): weights 2:1 over h100 and l4.
    h100, l4 = (replicas * 2 + 2) // 3, replicas - (replicas * 2 + 2) // 3
    return status.Children(
        deployments=[f.workload("Deployment", "chat-draft", 1)],
        statefulsets=[
            f.workload("StatefulSet", "chat-target-h100", h100),
            f.workload("StatefulSet", "chat-target-l4", l4),
        ],
    )


def build(
    children: status.Children,
    *,
    spec: dict[str, Any] | None = None,
    previous: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    obs = status.Observation(owner=f.OWNER, generation=1, spec=parse(spec or f.spec()), children=children, **kw)
    return status.build(obs, {"observedGeneration": 1} if previous is None else previous, NOW)


def cond(built: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next(x for x in built["conditions"] if x["type"] == type_)
    return found


def test_a_healthy_cluster_is_ready() -> None:
    built = build(healthy())
    assert cond(built, c.COND_READY)["status"] == "True"
    assert cond(built, c.COND_DRAFT_READY)["status"] == "True"
    assert cond(built, c.COND_TARGETS_READY)["status"] == "True"
    assert cond(built, c.COND_READY)["observedGeneration"] == 1
    assert built["targets"] == {
        "replicas": 3,
        "readyReplicas": 3,
        "desiredReplicas": 3,
        "readyOfDesired": "3/3",
        "pools": [
            {"name": "h100", "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "desiredReplicas": 2},
            {"name": "l4", "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "desiredReplicas": 1},
        ],
    }
    assert built["selector"] == "app.kubernetes.io/instance=chat,app.kubernetes.io/component=target"
    assert built["draft"] == {"ready": True, "endpoint": "chat-draft.ml.svc:50051"}
    assert built["observedGeneration"] == 1


def test_the_draft_load_is_reported() -> None:
    built = build(healthy(), load=LOAD)
    assert built["draft"]["utilization"] == 0.42
    assert built["draft"]["regime"] == "UnderLoaded"
    assert built["draft"]["activeSessions"] == 12 and built["draft"]["connectedTargets"] == 3
    assert built["recommendedTargets"] == 7


def test_a_missing_draft_model_makes_ready_false_with_the_processs_message() -> None:
    children = healthy()
    children = status.Children(
        deployments=[f.workload("Deployment", "chat-draft", 1, ready=0)],
        statefulsets=children.statefulsets,
        pods=[crashing()],
    )
    built = build(children)
    ready = cond(built, c.COND_READY)
    assert ready["status"] == "False" and ready["reason"] == "ContainerFailing"
    assert MISSING_MODEL in ready["message"] and ready["message"].startswith("draft: ")
    assert cond(built, c.COND_DRAFT_READY)["reason"] == "ContainerFailing"
    assert built["draft"]["ready"] is False


def test_an_unknown_node_pool_makes_ready_false_unschedulable() -> None:
    pending = f.pod(
        "chat-target-h100-1",
        "target",
        "h100",
        phase="Pending",
        conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no nodes"}],
    )
    children = status.Children(
        deployments=[f.workload("Deployment", "chat-draft", 1)],
        statefulsets=[
            f.workload("StatefulSet", "chat-target-h100", 2, ready=1),
            f.workload("StatefulSet", "chat-target-l4", 1),
        ],
        pods=[pending],
    )
    built = build(children)
    assert cond(built, c.COND_TARGETS_READY)["reason"] == "Unschedulable"
    assert cond(built, c.COND_READY)["reason"] == "Unschedulable"
    assert "no nodes" in cond(built, c.COND_READY)["message"]
    assert built["targets"]["readyReplicas"] == 2
    assert built["targets"]["readyOfDesired"] == "2/3"


def test_children_not_created_yet() -> None:
    built = build(status.Children())
    assert cond(built, c.COND_DRAFT_READY)["reason"] == "NotCreated"
    assert cond(built, c.COND_TARGETS_READY)["reason"] == "NotCreated"
    assert cond(built, c.COND_READY)["status"] == "False"


def test_progressing_while_pods_start() -> None:
    children = status.Children(
        deployments=[f.workload("Deployment", "chat-draft", 1)],
        statefulsets=[
            f.workload("StatefulSet", "chat-target-h100", 2, ready=0),
            f.workload("StatefulSet", "chat-target-l4", 1),
        ],
    )
    targets = cond(build(children), c.COND_TARGETS_READY)
    assert (targets["reason"], targets["message"]) == ("Progressing", "1 of 3 targets ready")


def test_not_ready_until_the_current_generation_was_applied() -> None:
    built = build(healthy(), previous={"observedGeneration": 0})
    assert cond(built, c.COND_READY)["reason"] == "Reconciling"


def test_a_failed_reconcile_is_the_reason() -> None:
    built = build(healthy(), reconcile_error="Deployment.apps is invalid: bad quantity")
    ready = cond(built, c.COND_READY)
    assert ready["reason"] == "ReconcileFailed" and "bad quantity" in ready["message"]


def test_an_invalid_spec_is_the_reason() -> None:
    obs = status.Observation(owner=f.OWNER, generation=1, spec=None, spec_error="spec.pools must list a pool")
    built = status.build(obs, {}, NOW)
    assert cond(built, c.COND_READY)["reason"] == "InvalidSpec"
    assert "targets" not in built


def test_pool_bounds_that_cap_the_total_are_said() -> None:
    spec = f.spec(targets={"replicas": 5}, pools=[{"name": "h100", "maxReplicas": 2}])
    children = status.Children(
        deployments=[f.workload("Deployment", "chat-draft", 1)],
        statefulsets=[f.workload("StatefulSet", "chat-target-h100", 2)],
    )
    built = build(children, spec=spec)
    assert built["targets"]["desiredReplicas"] == 2
    assert "pool bounds cap 5 at 2" in cond(built, c.COND_TARGETS_READY)["message"]
    assert cond(built, c.COND_READY)["status"] == "True"


AUTOSCALED = f.spec(autoscaling={"enabled": True})


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"decision": Decision(5, 3, "UnderLoaded", "3 -> 5")}, ("True", "UnderLoaded")),
        ({"decision": Decision(3, 3, "Balanced", "fine")}, ("False", "Balanced")),
        ({"load_error": "connection refused"}, ("False", "LoadUnavailable")),
        ({}, ("False", "Waiting")),
    ],
)
def test_the_rebalancing_condition(kw: dict[str, Any], expected: tuple[str, str]) -> None:
    rebalancing = cond(build(healthy(), spec=AUTOSCALED, **kw), c.COND_REBALANCING)
    assert (rebalancing["status"], rebalancing["reason"]) == expected


def test_rebalancing_stays_true_until_the_change_converges() -> None:
    previous = {"observedGeneration": 1, "lastRebalance": {"to": 3, "from": 1, "reason": "UnderLoaded"}}
    decision = Decision(3, 3, NOT_CONVERGED, "waiting for targets to settle: 1 of 3 ready")
    rebalancing = cond(build(healthy(), spec=AUTOSCALED, previous=previous, decision=decision), c.COND_REBALANCING)
    assert (rebalancing["status"], rebalancing["reason"]) == ("True", "Converging")


def test_rebalancing_is_disabled_without_autoscaling() -> None:
    assert cond(build(healthy()), c.COND_REBALANCING)["reason"] == "Disabled"


def test_a_decision_is_recorded_as_last_rebalance() -> None:
    built = build(healthy(), spec=AUTOSCALED, decision=Decision(5, 3, "UnderLoaded", "3 -> 5 targets: why"))
    assert built["lastRebalance"] == {
        "time": "2026-03-01T12:00:00Z",
        "from": 3,
        "to": 5,
        "reason": "UnderLoaded",
        "message": "3 -> 5 targets: why",
    }
    kept = build(healthy(), previous={"observedGeneration": 1, "lastRebalance": built["lastRebalance"]})
    assert kept["lastRebalance"] == built["lastRebalance"]


def test_an_unchanged_cluster_needs_no_patch() -> None:
    first = build(healthy(), load=LOAD)
    again = build(healthy(), previous=first, load=LOAD)
    assert status.merge_patch(first, again) == {}


def test_merge_patch() -> None:
    old = {"a": 1, "d": {"x": 1, "y": 2}, "gone": True, "l": [1, 2]}
    new = {"a": 1, "d": {"x": 1, "z": 3}, "l": [1]}
    assert status.merge_patch(old, new) == {"d": {"y": None, "z": 3}, "gone": None, "l": [1]}
    assert status.merge_patch({}, {"a": {"b": 1}}) == {"a": {"b": 1}}


def test_a_lost_load_reading_clears_the_load_fields() -> None:
    first = build(healthy(), load=LOAD)
    later = build(healthy(), previous=first, load_error="timed out")
    patch = status.merge_patch(first, later)
    assert patch["draft"]["utilization"] is None and patch["recommendedTargets"] is None


def three_drafts(ready: int) -> tuple[dict[str, Any], status.Children]:
    spec = f.spec(draft={"model": {"path": "/models/draft"}, "replicas": 3})
    children = healthy()
    drafts = f.workload("Deployment", "chat-draft", 3, ready=ready)
    return spec, status.Children(deployments=[drafts], statefulsets=children.statefulsets)


def test_the_drafts_are_counted_ready_over_desired() -> None:
    spec, children = three_drafts(ready=2)
    built = build(children, spec=spec)
    assert built["drafts"] == {"replicas": 3, "ready": 2, "desired": 3, "readyOfDesired": "2/3"}
    draft = cond(built, c.COND_DRAFT_READY)
    assert (draft["status"], draft["reason"]) == ("False", "Progressing")
    assert draft["message"] == "draft chat-draft: 2 of 3 ready, 3 up to date"
    assert cond(built, c.COND_READY)["status"] == "False"
    # The one-draft fields stay as they were.
    assert built["draft"] == {"ready": False, "endpoint": "chat-draft.ml.svc:50051"}


def test_every_draft_ready_makes_the_draft_ready() -> None:
    spec, children = three_drafts(ready=3)
    built = build(children, spec=spec)
    assert built["drafts"]["readyOfDesired"] == "3/3"
    assert cond(built, c.COND_DRAFT_READY)["message"] == "3 drafts of chat-draft are ready"
    assert cond(built, c.COND_READY)["status"] == "True"


def test_drafts_not_created_yet() -> None:
    built = build(status.Children())
    assert built["drafts"] == {"replicas": 0, "ready": 0, "desired": 1, "readyOfDesired": "0/1"}
    assert cond(built, c.COND_DRAFT_READY)["message"] == "deployment chat-draft does not exist yet"


def test_a_crashing_draft_pod_among_several_is_named() -> None:
    spec, children = three_drafts(ready=2)
    built = build(
        status.Children(deployments=children.deployments, statefulsets=children.statefulsets, pods=[crashing()]),
        spec=spec,
    )
    assert cond(built, c.COND_DRAFT_READY)["reason"] == "ContainerFailing"
    assert MISSING_MODEL in cond(built, c.COND_DRAFT_READY)["message"]
