"""A pool whose pods the scheduler cannot place: the scheduler's words in the pool's status and in TargetsReady
with the pool named (what `kubectl describe ssd` shows). No Warning Event of the operator's: a pod waiting for
a node (the cluster autoscaler may be adding one) is no fault, and the scheduler posts its own FailedScheduling
on the pod."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
from starsd_operator import constants as c
from starsd_operator import controller, diagnose, status
from starsd_operator.controller import Config, Memory
from starsd_operator.rebalancer import Load
from starsd_operator.spec import parse

from . import factories as f
from .fakekube import FakeKube
from .schema_tools import to_jsonschema

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NO_NODE = (
    "0/5 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 4 node(s) had untolerated "
    "taint {nvidia.com/gpu: present}. preemption: 0/5 nodes are available: 5 Preemption is not helpful for "
    "scheduling."
)


def unscheduled(name: str, pool: str, message: str = NO_NODE) -> dict[str, Any]:
    """A target pod as the scheduler leaves one it cannot place: Pending, PodScheduled=False."""
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return f.pod(name, c.COMPONENT_TARGET, pool, phase="Pending", conditions=[scheduled])


def running(name: str, pool: str) -> dict[str, Any]:
    return f.pod(
        name, c.COMPONENT_TARGET, pool, phase="Running", conditions=[{"type": "PodScheduled", "status": "True"}]
    )


def test_pending_counts_the_unplaced_pods_and_keeps_the_first_ones_words() -> None:
    pods = [unscheduled("t-1", "h100", "second"), running("t-2", "h100"), unscheduled("t-0", "h100", "first")]
    assert diagnose.pending(pods) == diagnose.Pending(pods=2, reason="Unschedulable", message="first")
    assert diagnose.pending([running("t-0", "h100")]) is None
    assert diagnose.pending([]) is None


def built_status(pods: list[dict[str, Any]]) -> dict[str, Any]:
    children = status.Children(
        deployments=[f.workload("Deployment", "chat-draft", 1)],
        statefulsets=[
            f.workload("StatefulSet", "chat-target-h100", 2, ready=0),
            f.workload("StatefulSet", "chat-target-l4", 1),
        ],
        pods=pods,
    )
    obs = status.Observation(owner=f.OWNER, generation=1, spec=parse(f.spec()), children=children)
    return status.build(obs, {"observedGeneration": 1}, T0)


def test_the_pool_whose_pods_find_no_node_carries_the_schedulers_message_and_the_condition_names_it() -> None:
    built = built_status([unscheduled("chat-target-h100-0", "h100"), unscheduled("chat-target-h100-1", "h100")])
    pools = {p["name"]: p for p in built["targets"]["pools"]}
    assert pools["h100"]["pending"] == {"pods": 2, "reason": "Unschedulable", "message": NO_NODE}
    assert "pending" not in pools["l4"]
    conditions = {x["type"]: x for x in built["conditions"]}
    targets = conditions[c.COND_TARGETS_READY]
    assert (targets["status"], targets["reason"]) == ("False", "Unschedulable")
    assert targets["message"] == (f"pool h100: 2 pods Pending: pod chat-target-h100-0 cannot be scheduled: {NO_NODE}")
    assert conditions[c.COND_READY]["message"].startswith("targets: pool h100: 2 pods Pending: ")


def test_the_pending_entry_is_valid_status_for_the_crd() -> None:
    built = built_status([unscheduled("chat-target-h100-0", "h100")])
    schema = f.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    jsonschema.Draft7Validator(to_jsonschema(copy.deepcopy(schema))).validate(built)  # strict: no unknown field
    pools = schema["properties"]["targets"]["properties"]["pools"]["items"]["properties"]
    assert set(pools["pending"]["properties"]) == {"pods", "reason", "message"}


def test_a_placed_pool_has_no_pending_entry_once_its_pods_are_scheduled() -> None:
    built = built_status([running("chat-target-h100-0", "h100")])
    assert all("pending" not in p for p in built["targets"]["pools"])


def under_loaded(_url: str) -> Load:
    return Load(
        utilization=0.2,
        window_seconds=5,
        tq_seconds=0.004,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=0,
        targets=0,
        regime="UnderLoaded",
        active_sessions=0,
        recommended_targets=2,
    )


def as_listed(pod: dict[str, Any]) -> dict[str, Any]:
    pod.update(kind="Pod")
    pod["metadata"].update(
        namespace=f.OWNER.namespace, labels={**pod["metadata"]["labels"], c.LABEL_MANAGED_BY: c.MANAGED_BY}
    )
    return pod


def test_a_tick_writes_the_pending_reason_into_the_status_and_clears_it_once_the_pod_is_placed() -> None:
    body = f.body()
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, body, Config(), memory)
    kube.settle()
    body["status"]["observedGeneration"] = body["metadata"]["generation"]
    kube.edit("StatefulSet", "ml", "chat-target-h100", lambda o: o["status"].update(readyReplicas=0))
    kube.put(as_listed(unscheduled("chat-target-h100-0", "h100")))

    result = controller.tick(kube, body, Config(), memory, now=T0, fetch=under_loaded)
    pools = {p["name"]: p for p in result.status_patch["targets"]["pools"]}
    assert pools["h100"]["pending"] == {"pods": 1, "reason": "Unschedulable", "message": NO_NODE}
    targets = {x["type"]: x for x in result.status_patch["conditions"]}[c.COND_TARGETS_READY]
    assert targets["message"].startswith("pool h100: 1 pod Pending: pod chat-target-h100-0 cannot be scheduled")
    assert [e for e in result.events if e.type == "Warning"] == []

    kube.put(as_listed(running("chat-target-h100-0", "h100")))  # a node came: the scheduler placed it
    placed = controller.tick(kube, body, Config(), memory, now=T0 + timedelta(seconds=30), fetch=under_loaded)
    assert all("pending" not in p for p in placed.status_patch["targets"]["pools"])
