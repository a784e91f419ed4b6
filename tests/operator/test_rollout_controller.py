"""A model change through the controller against an in-memory API server: the StatefulSets the reconcile
applies (template hash, partition, minReadySeconds), the tick stepping the partition, and the halt in the
status patch and its Event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starsd_operator import constants as c
from starsd_operator import controller, naming, rollout
from starsd_operator.controller import Config, Memory

from . import factories as f
from .fakekube import FakeKube

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = Config()


def no_fetch(url: str) -> Any:
    raise AssertionError(f"fetched {url}")


def stateful_set(kube: FakeKube, pool: str) -> dict[str, Any]:
    return kube.objects[("StatefulSet", f.OWNER.namespace, naming.pool_name(f.OWNER, pool))]


def partition(kube: FakeKube, pool: str) -> int:
    return int(stateful_set(kube, pool)["spec"]["updateStrategy"]["rollingUpdate"]["partition"])


def run(kube: FakeKube, pool: str, revisions: dict[int, str], current: str, update: str, **ready: bool) -> None:
    """Play the StatefulSet controller and kwok: the pool's pods at these revisions, its status."""
    sts = stateful_set(kube, pool)
    n = sts["spec"]["replicas"]
    for ordinal, revision in revisions.items():
        name = f"{naming.pool_name(f.OWNER, pool)}-{ordinal}"
        ok = ready.get(f"pod{ordinal}", True)
        status: dict[str, Any] = {
            "conditions": [{"type": "Ready", "status": str(ok), "lastTransitionTime": "2026-03-01T11:59:00Z"}]
        }
        if not ok:
            status["containerStatuses"] = [
                {
                    "name": "target",
                    "ready": False,
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "message": "model not found: /models/target-v2"}},
                }
            ]
        kube.put(
            {
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": f.OWNER.namespace,
                    "labels": {**naming.labels(f.OWNER, c.COMPONENT_TARGET, pool), rollout.REVISION_LABEL: revision},
                },
                "status": status,
            }
        )
    sts["status"] = {
        "observedGeneration": 0,
        "replicas": n,
        "readyReplicas": n,
        "availableReplicas": n,
        "updatedReplicas": sum(1 for r in revisions.values() if r == update),
        "currentRevision": current,
        "updateRevision": update,
    }


def test_a_model_change_rolls_pool_by_pool_and_halts_on_a_crashing_pod() -> None:
    kube, memory = FakeKube(), Memory()
    spec = f.spec(targets={"replicas": 3})  # h100 2, l4 1
    body = f.body(spec)
    controller.reconcile(kube, body, CONFIG, memory)
    assert partition(kube, "h100") == partition(kube, "l4") == 0  # a new cluster: created at once
    assert stateful_set(kube, "h100")["spec"]["minReadySeconds"] == 0
    first_hash = stateful_set(kube, "h100")["metadata"]["annotations"][rollout.ANNOTATION_TEMPLATE_HASH]
    run(kube, "h100", {0: "r1", 1: "r1"}, "r1", "r1")
    run(kube, "l4", {0: "q1"}, "q1", "q1")
    body["status"]["observedGeneration"] = 1

    # The target model changes: h100 takes it from its top pod, l4 takes the template but holds every pod.
    spec["target"]["model"]["path"] = "/models/target-v2"
    body = f.body(spec, generation=2, status=body["status"])
    controller.reconcile(kube, body, CONFIG, memory, now=T0.timestamp())
    assert stateful_set(kube, "h100")["metadata"]["annotations"][rollout.ANNOTATION_TEMPLATE_HASH] != first_hash
    assert (partition(kube, "h100"), partition(kube, "l4")) == (1, 1)
    body["status"]["observedGeneration"] = 2

    # The controllers act: h100-1 runs r2 and is ready; l4 knows its new revision but replaced nothing.
    run(kube, "h100", {0: "r1", 1: "r2"}, "r1", "r2")
    run(kube, "l4", {0: "q1"}, "q1", "q2")
    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=no_fetch)
    assert (partition(kube, "h100"), partition(kube, "l4")) == (0, 1)  # the tick stepped h100
    pools = {p["name"]: p["rollout"] for p in result.status_patch["targets"]["pools"]}
    assert (pools["h100"]["state"], pools["l4"]["state"]) == (rollout.ROLLING, rollout.HELD)
    assert {e.reason for e in result.events} >= {c.EVENT_POOL_ROLLING, c.EVENT_POOL_ROLLOUT_HELD}
    body["status"].update(result.status_patch)

    # h100-0 comes up on r2 and crash-loops: h100 halts (its partition back at its replicas), l4 stays held.
    run(kube, "h100", {0: "r2", 1: "r2"}, "r1", "r2", pod0=False)
    result = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=5), fetch=no_fetch)
    assert (partition(kube, "h100"), partition(kube, "l4")) == (2, 1)
    conds = {x["type"]: x for x in result.status_patch["conditions"]}
    halted = conds[c.COND_ROLLOUT_PROGRESSING]
    assert (halted["status"], halted["reason"]) == ("False", rollout.REASON_HALTED)
    assert "chat-target-h100-0" in halted["message"] and "model not found" in halted["message"]
    [warning] = [e for e in result.events if e.type == "Warning"]
    assert warning.reason == c.EVENT_POOL_ROLLOUT_HALTED and "revision r2" in warning.message
    body["status"] = {**body["status"], **result.status_patch}

    # The same observation again: no new Event, nothing applied.
    applied = len(kube.applied)
    again = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=10), fetch=no_fetch)
    assert [e for e in again.events if e.reason.startswith("Pool")] == []
    assert len(kube.applied) == applied
