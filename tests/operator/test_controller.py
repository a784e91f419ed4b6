"""One reconcile and one tick against an in-memory API server: what gets applied and deleted, the status
patch, and the rebalancer's atomic change of the target count with its Event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starsd_operator import constants as c
from starsd_operator import controller
from starsd_operator.controller import Config, Memory
from starsd_operator.kube import KubeError
from starsd_operator.loadclient import LoadUnavailable
from starsd_operator.rebalancer import Load
from starsd_operator.spec import SpecError

from starsd.devices import cuda_refusal

from . import factories as f
from .fakekube import FakeKube

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = Config()
OVERRIDABLE = Config(allow_load_url_annotation=True)  # honours the load-url annotation (tests, local runs)
LOAD_URL = "http://127.0.0.1:7777/v1/load"


def under_loaded(_url: str) -> Load:
    return Load(
        utilization=0.2,
        window_seconds=5,
        tq_seconds=0.004,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=0,
        targets=3,
        regime="UnderLoaded",
        active_sessions=20,
        recommended_targets=7,
        running_requests=150,
        waiting_requests=4,
        target_occupancy=0.9,
    )


def reconciled(body: dict[str, Any]) -> tuple[FakeKube, Memory]:
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, body, CONFIG, memory)
    kube.settle()
    body["status"]["observedGeneration"] = body["metadata"]["generation"]
    return kube, memory


def no_fetch(url: str) -> Load:
    raise AssertionError(f"fetched {url}")


def conditions(result: controller.TickResult) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in result.status_patch.get("conditions", [])}


def test_reconcile_applies_every_child() -> None:
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, f.body(), CONFIG, memory)
    assert kube.applied == [
        ("Service", "chat-draft"),
        ("Service", "chat-draft-pods"),
        ("NetworkPolicy", "chat-draft"),
        ("Deployment", "chat-draft"),
        ("Service", "chat"),
        ("NetworkPolicy", "chat-target"),
        ("PodDisruptionBudget", "chat-draft"),
        ("Service", "chat-target-h100"),
        ("StatefulSet", "chat-target-h100"),
        ("PodDisruptionBudget", "chat-target-h100"),
        ("Service", "chat-target-l4"),
        ("StatefulSet", "chat-target-l4"),
        ("PodDisruptionBudget", "chat-target-l4"),
    ]
    assert memory.reconcile_error is None and kube.deleted == []


def test_reconcile_is_idempotent() -> None:
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, f.body(), CONFIG, memory)
    before = {k: v for k, v in kube.objects.items()}
    controller.reconcile(kube, f.body(), CONFIG, memory)
    assert kube.objects == before and kube.deleted == []


def test_a_pool_that_leaves_the_spec_is_deleted() -> None:
    kube, memory = reconciled(f.body())
    foreign = {
        "kind": "StatefulSet",
        "metadata": {
            "name": "chat-target-old",
            "namespace": "ml",
            "labels": {c.LABEL_INSTANCE: "chat", c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "target"},
            "ownerReferences": [{"uid": "someone-else"}],
        },
        "spec": {"replicas": 1},
    }
    kube.put(foreign)
    one_pool = f.spec(pools=[{"name": "h100"}])
    controller.reconcile(kube, f.body(one_pool, generation=2), CONFIG, memory)
    assert sorted(kube.deleted) == [
        ("PodDisruptionBudget", "chat-target-l4"),
        ("Service", "chat-target-l4"),
        ("StatefulSet", "chat-target-l4"),
    ]
    assert ("StatefulSet", "ml", "chat-target-old") in kube.objects  # not ours: left alone


def reasons(events: list[controller.Event]) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in events]


def test_reconcile_posts_a_normal_event_per_created_child_and_none_when_nothing_changed() -> None:
    kube, memory = FakeKube(), Memory()
    events = controller.reconcile(kube, f.body(), CONFIG, memory)
    assert reasons(events) == [("Normal", c.EVENT_CREATED, f"created {k} {n}") for k, n in kube.applied]
    assert len(events) == 13
    assert controller.reconcile(kube, f.body(), CONFIG, memory) == []


def test_reconcile_posts_scaled_events_for_the_workloads_whose_replicas_moved() -> None:
    kube, memory = reconciled(f.body())  # 3 targets: h100 2, l4 1
    events = controller.reconcile(kube, f.body(f.spec(targets={"replicas": 6}), generation=2), CONFIG, memory)
    assert reasons(events) == [
        ("Normal", c.EVENT_SCALED, "scaled StatefulSet chat-target-h100 from 2 to 4 replicas"),
        ("Normal", c.EVENT_SCALED, "scaled StatefulSet chat-target-l4 from 1 to 2 replicas"),
    ]


def legacy_draft_statefulset(uid: str = f.OWNER.uid) -> dict[str, Any]:
    """The draft StatefulSet an operator of the StatefulSet days applied (its own name, labels and owner)."""
    return {
        "kind": "StatefulSet",
        "metadata": {
            "name": "chat-draft",
            "namespace": "ml",
            "labels": {c.LABEL_INSTANCE: "chat", c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "draft"},
            "ownerReferences": [{"uid": uid, "controller": True}],
        },
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "draft", "image": "reg/draft:0"}]}}},
        "status": {"replicas": 1, "readyReplicas": 1},
    }


class DeploymentReadyFirst(FakeKube):
    """Refuses to delete the draft StatefulSet while the draft Deployment is not ready."""

    def delete(self, kind: str, namespace: str, name: str) -> None:
        if kind == "StatefulSet" and name == "chat-draft":
            dep = self.objects.get(("Deployment", namespace, "chat-draft"))
            assert dep is not None, "deleted before the Deployment exists"
            assert controller.deployment_ready(dep), "deleted before the Deployment is ready"
        super().delete(kind, namespace, name)


def test_an_old_draft_statefulset_is_deleted_only_once_the_draft_deployment_is_ready() -> None:
    body = f.body()
    kube, memory = DeploymentReadyFirst(), Memory()
    kube.put(legacy_draft_statefulset())
    events = controller.reconcile(kube, body, CONFIG, memory)
    # Applied, not ready yet: the old drafts keep serving.
    assert ("Deployment", "ml", "chat-draft") in kube.objects
    assert ("StatefulSet", "ml", "chat-draft") in kube.objects and kube.deleted == []
    assert not any(e.reason == c.EVENT_DELETED for e in events)
    body["status"]["observedGeneration"] = 1
    assert not any(
        e.reason == c.EVENT_DELETED
        for e in controller.tick(kube, body, CONFIG, memory, now=T0, fetch=under_loaded).events
    )
    kube.settle()  # the Deployment's draft is ready
    ticked = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=5), fetch=under_loaded)
    assert ("StatefulSet", "ml", "chat-draft") not in kube.objects
    assert kube.deleted == [("StatefulSet", "chat-draft")]
    message = "deleted StatefulSet chat-draft: the drafts run in Deployment chat-draft now"
    assert ("Normal", c.EVENT_DELETED, message) in reasons(ticked.events)
    # The next reconcile (a restart, say) has nothing left to do.
    assert controller.reconcile(kube, body, CONFIG, memory) == []
    assert kube.deleted == [("StatefulSet", "chat-draft")]


def test_a_restart_between_the_apply_and_the_delete_converges() -> None:
    kube = FakeKube()
    kube.put(legacy_draft_statefulset())
    controller.reconcile(kube, f.body(), CONFIG, Memory())
    kube.settle()
    kube.fail_delete = KubeError(0, "API server unreachable")  # the operator dies on the delete
    with pytest.raises(KubeError):
        controller.reconcile(kube, f.body(), CONFIG, Memory())
    assert {("StatefulSet", "ml", "chat-draft"), ("Deployment", "ml", "chat-draft")} <= set(kube.objects)
    kube.fail_delete = None
    controller.reconcile(kube, f.body(), CONFIG, Memory())  # a new process resumes
    assert ("StatefulSet", "ml", "chat-draft") not in kube.objects
    assert ("Deployment", "ml", "chat-draft") in kube.objects


def test_a_draft_statefulset_of_someone_else_is_left_alone() -> None:
    kube = FakeKube()
    kube.put(legacy_draft_statefulset(uid="someone-else"))
    controller.reconcile(kube, f.body(), CONFIG, Memory())
    kube.settle()
    controller.reconcile(kube, f.body(), CONFIG, Memory())
    assert ("StatefulSet", "ml", "chat-draft") in kube.objects and kube.deleted == []


def test_the_old_draft_statefulsets_image_is_kept_under_a_pinned_policy() -> None:
    kube = FakeKube()
    kube.put(legacy_draft_statefulset())
    controller.reconcile(kube, f.body(), Config(), Memory())
    dep = kube.objects[("Deployment", "ml", "chat-draft")]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/draft:0"


def test_a_deployment_is_ready_when_it_runs_every_replica_of_its_latest_spec() -> None:
    ready = f.workload("Deployment", "chat-draft", 2)
    assert controller.deployment_ready(ready)
    assert not controller.deployment_ready(f.workload("Deployment", "chat-draft", 2, ready=1))
    assert not controller.deployment_ready({**ready, "metadata": {**ready["metadata"], "generation": 2}})
    assert not controller.deployment_ready(None)


def test_reconcile_posts_an_event_per_child_of_a_pool_that_left() -> None:
    kube, memory = reconciled(f.body())
    events = controller.reconcile(kube, f.body(f.spec(pools=[{"name": "h100"}]), generation=2), CONFIG, memory)
    deleted = [e for e in reasons(events) if e[1] == c.EVENT_DELETED]
    assert sorted(m for _, _, m in deleted) == [
        "deleted PodDisruptionBudget chat-target-l4: its pool left the spec",
        "deleted Service chat-target-l4: its pool left the spec",
        "deleted StatefulSet chat-target-l4: its pool left the spec",
    ]


def test_a_pool_scaled_to_zero_loses_its_budget_and_gets_it_back() -> None:
    kube, memory = reconciled(f.body())
    pools = [{"name": "h100", "weight": 1, "maxReplicas": 1}, {"name": "l4", "weight": 0}]
    events = controller.reconcile(
        kube, f.body(f.spec(pools=pools, targets={"replicas": 1}), generation=2), CONFIG, memory
    )
    assert [e for e in reasons(events) if e[1] == c.EVENT_DELETED] == [
        ("Normal", c.EVENT_DELETED, "deleted PodDisruptionBudget chat-target-l4: its pool has no replicas")
    ]
    assert ("StatefulSet", "ml", "chat-target-l4") in kube.objects
    controller.reconcile(kube, f.body(f.spec(pools=pools, targets={"replicas": 3}), generation=3), CONFIG, memory)
    assert ("PodDisruptionBudget", "ml", "chat-target-l4") in kube.objects


def test_a_repair_reports_what_it_created_again() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    kube.delete("StatefulSet", "ml", "chat-target-l4")
    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=under_loaded)
    assert ("Normal", c.EVENT_REPAIRED, "StatefulSet chat-target-l4 was missing") in reasons(result.events)


def test_reconcile_failures_are_remembered_for_the_status() -> None:
    kube, memory = FakeKube(), Memory()
    kube.fail_apply = KubeError(422, "StatefulSet.apps is invalid")
    with pytest.raises(KubeError):
        controller.reconcile(kube, f.body(generation=3), CONFIG, memory)
    assert memory.reconcile_error == (3, "StatefulSet.apps is invalid")
    with pytest.raises(SpecError):
        controller.reconcile(kube, f.body(f.spec(pools=[]), generation=4), CONFIG, memory)
    assert memory.reconcile_error is not None and memory.reconcile_error[0] == 4
    kube.fail_apply = None
    controller.reconcile(kube, f.body(generation=5), CONFIG, memory)
    assert memory.reconcile_error is None


def test_a_tick_on_a_healthy_cluster_reports_ready() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=lambda _u: under_loaded(_u))
    conds = conditions(result)
    assert conds[c.COND_READY]["status"] == "True"
    assert result.status_patch["targets"]["readyReplicas"] == 3
    assert result.status_patch["draft"]["utilization"] == 0.2
    assert conds[c.COND_REBALANCING]["reason"] == "Disabled"
    assert result.events == []


def test_the_draft_is_not_polled_before_it_is_ready() -> None:
    body = f.body()
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, body, CONFIG, memory)
    body["status"]["observedGeneration"] = 1
    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=no_fetch)
    assert conditions(result)[c.COND_READY]["status"] == "False"


def test_a_failed_reconcile_shows_in_ready() -> None:
    body = f.body()
    kube, memory = FakeKube(), Memory()
    kube.fail_apply = KubeError(403, "forbidden: cannot create statefulsets")
    with pytest.raises(KubeError):
        controller.reconcile(kube, body, CONFIG, memory)
    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=no_fetch)
    ready = conditions(result)[c.COND_READY]
    assert ready["reason"] == "ReconcileFailed" and "forbidden" in ready["message"]


def test_an_invalid_spec_shows_in_ready_without_touching_children() -> None:
    body = f.body(f.spec(target={"model": {"path": "/t"}, "gamma": 99}))
    kube = FakeKube()
    result = controller.tick(kube, body, CONFIG, Memory(), now=T0, fetch=no_fetch)
    assert conditions(result)[c.COND_READY]["reason"] == "InvalidSpec"
    assert kube.applied == []


def test_workloads_deleted_behind_the_operators_back_are_applied_again() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    kube.delete("StatefulSet", "ml", "chat-target-l4")
    kube.applied.clear()
    controller.tick(kube, body, CONFIG, memory, now=T0, fetch=under_loaded)
    assert ("StatefulSet", "chat-target-l4") in kube.applied


def test_no_repair_of_a_cluster_being_deleted() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    kube.delete("StatefulSet", "ml", "chat-target-l4")
    kube.applied.clear()
    body["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    controller.tick(kube, body, CONFIG, memory, now=T0, fetch=under_loaded)
    assert kube.applied == []


def test_no_repair_while_the_handler_has_not_applied_this_generation() -> None:
    body = f.body(generation=2)
    kube, memory = FakeKube(), Memory()
    body["status"]["observedGeneration"] = 1
    controller.tick(kube, body, CONFIG, memory, now=T0, fetch=no_fetch)
    assert kube.applied == []


def test_listing_failures_propagate() -> None:
    kube = FakeKube()
    kube.fail_list = KubeError(0, "API server unreachable")
    with pytest.raises(KubeError):
        controller.tick(kube, f.body(), CONFIG, Memory(), now=T0, fetch=no_fetch)


def autoscaled(window: int = 10) -> dict[str, Any]:
    spec = f.spec(
        autoscaling={
            "enabled": True,
            "minTargets": 1,
            "maxTargets": 16,
            "scaleUp": {"stabilizationWindowSeconds": window, "maxStep": 4},
        }
    )
    return f.body(spec, annotations={c.ANNOTATION_LOAD_URL: LOAD_URL})


def test_the_rebalancer_raises_the_count_once_the_window_is_covered() -> None:
    body = autoscaled(window=10)
    kube, memory = reconciled(body)
    urls: list[str] = []

    def fetch(url: str) -> Load:
        urls.append(url)
        return under_loaded(url)

    results = []
    for i in range(12):
        result = controller.tick(kube, body, OVERRIDABLE, memory, now=T0 + timedelta(seconds=5 * i), fetch=fetch)
        results.append(result)
        # What the API server and kopf then do: the swap lands in the spec (a new generation), the patch in
        # the status.
        body["status"].update(result.status_patch)
        if kube.swaps and body["spec"]["targets"]["replicas"] != kube.swaps[-1][1]:
            body["spec"]["targets"]["replicas"] = kube.swaps[-1][1]
            body["metadata"]["generation"] += 1
    assert set(urls) == {LOAD_URL}
    changed = [r for r in results if r.events]
    assert len(changed) == 1 and kube.swaps == [(3, 7)]
    [event] = changed[0].events
    assert (event.type, event.reason) == ("Normal", c.EVENT_REBALANCED)
    assert "3 -> 7 targets" in event.message
    patch = changed[0].status_patch
    assert {k: patch["lastRebalance"][k] for k in ("from", "to", "reason")} == {
        "from": 3,
        "to": 7,
        "reason": "UnderLoaded",
    }
    assert conditions(changed[0])[c.COND_REBALANCING]["status"] == "True"
    assert body["status"]["recommendedTargets"] == 7
    # The StatefulSets are not resized yet (no reconcile here): the rebalancer waits, saying so.
    [rebalancing] = [x for x in body["status"]["conditions"] if x["type"] == c.COND_REBALANCING]
    assert (rebalancing["status"], rebalancing["reason"]) == ("True", "Converging")


def test_a_concurrent_change_of_the_count_wins_over_the_rebalancer() -> None:
    body = autoscaled(window=0)
    kube, memory = reconciled(body)
    kube.swap_ok = False
    results = [
        controller.tick(kube, body, OVERRIDABLE, memory, now=T0 + timedelta(seconds=5 * i), fetch=under_loaded)
        for i in range(4)
    ]
    assert kube.swaps and all(r.events == [] for r in results)
    reasons = {conditions(r)[c.COND_REBALANCING]["reason"] for r in results if "conditions" in r.status_patch}
    assert "Conflict" in reasons
    assert all("lastRebalance" not in r.status_patch for r in results)


def test_an_unreadable_load_holds_and_says_why() -> None:
    body = autoscaled(window=0)
    kube, memory = reconciled(body)

    def down(url: str) -> Load:
        raise LoadUnavailable(f"{url}: connection refused")

    result = controller.tick(kube, body, OVERRIDABLE, memory, now=T0, fetch=down)
    rebalancing = conditions(result)[c.COND_REBALANCING]
    assert rebalancing["reason"] == "LoadUnavailable" and "connection refused" in rebalancing["message"]
    assert kube.swaps == []


def test_an_unchanged_cluster_writes_nothing() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    first = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=under_loaded)
    body["status"].update(first.status_patch)
    second = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=5), fetch=under_loaded)
    assert second.status_patch == {}


def test_the_draft_deployment_deleted_behind_the_operators_back_is_applied_again() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    kube.delete("Deployment", "ml", "chat-draft")
    kube.applied.clear()
    controller.tick(kube, body, CONFIG, memory, now=T0, fetch=under_loaded)
    assert ("Deployment", "chat-draft") in kube.applied


def test_a_tick_of_an_upgraded_operator_applies_the_draft_deployment_and_then_replaces_the_statefulset() -> None:
    """A cluster reconciled by an operator of the StatefulSet days: its drafts are a StatefulSet. The new
    operator's first tick (whichever of resume and tick runs first) applies the Deployment; once that is ready,
    a pass deletes the StatefulSet."""
    body = f.body()
    body["status"]["observedGeneration"] = 1
    kube, memory = DeploymentReadyFirst(), Memory()
    kube.put(legacy_draft_statefulset())
    controller.tick(kube, body, CONFIG, memory, now=T0, fetch=no_fetch)
    assert ("Deployment", "ml", "chat-draft") in kube.objects
    assert ("StatefulSet", "ml", "chat-draft") in kube.objects
    kube.settle()
    events = controller.converge(kube, body, CONFIG, memory, now=T0.timestamp() + 1)
    assert ("StatefulSet", "ml", "chat-draft") not in kube.objects
    assert any(e.reason == c.EVENT_DELETED and "StatefulSet chat-draft" in e.message for e in events)


def test_a_tick_reports_the_drafts_and_polls_once_one_is_ready() -> None:
    body = f.body(f.spec(draft={"model": {"path": "/models/draft"}, "replicas": 3}))
    kube, memory = reconciled(body)
    dep = kube.objects[("Deployment", "ml", "chat-draft")]
    dep["status"]["readyReplicas"] = 1
    for name, ip, ready in (
        ("chat-draft-7d9c-x2x9q", "10.1.0.7", "True"),
        ("chat-draft-7d9c-abcde", "10.1.0.9", "False"),
    ):
        pod = f.pod(name, "draft", podIP=ip, conditions=[{"type": "Ready", "status": ready}])
        pod["kind"], pod["metadata"]["namespace"] = "Pod", "ml"
        pod["metadata"]["labels"][c.LABEL_MANAGED_BY] = c.MANAGED_BY
        kube.put(pod)
    fetched: list[str] = []

    def fetch(url: str) -> Load:
        fetched.append(url)
        return under_loaded(url)

    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=fetch)
    drafts = result.status_patch["drafts"]
    assert {k: drafts[k] for k in ("replicas", "ready", "desired", "readyOfDesired")} == {
        "replicas": 3,
        "ready": 1,
        "desired": 3,
        "readyOfDesired": "1/3",
    }
    assert conditions(result)[c.COND_DRAFT_READY]["status"] == "False"
    # every ready draft pod's own /v1/load (by its address: draft pods have no DNS names of their own), one
    # row per draft read in status
    assert fetched == ["http://10.1.0.7:9090/v1/load"]
    assert [row["index"] for row in drafts["loads"]] == [0]
    assert drafts["worstUtilization"] == 0.2


def saturated_draft(_url: str) -> Load:
    return Load(
        utilization=0.97,
        window_seconds=5,
        tq_seconds=0.004,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=1.0,
        targets=3,
        regime="FullyLoaded",
        active_sessions=3,
        recommended_targets=3,
        waiting_requests=2,
        target_occupancy=0.9,
    )


def test_saturated_drafts_with_demand_get_one_more_draft_through_the_spec() -> None:
    """Autoscaling with maxDrafts 3: every draft saturated while targets queue -> spec.draft.replicas 1 -> 2,
    once the scale-up window is covered, with a Rebalanced Event and status.drafts.lastRebalance."""
    spec = f.spec(
        draft={"model": {"path": "/models/draft"}, "replicas": 1},
        autoscaling={
            "enabled": True,
            "minTargets": 1,
            "maxTargets": 16,
            "minDrafts": 1,
            "maxDrafts": 3,
            "scaleUp": {"stabilizationWindowSeconds": 10, "maxStep": 4},
        },
    )
    body = f.body(spec)
    kube, memory = reconciled(body)
    kube.objects[("Deployment", "ml", "chat-draft")]["status"]["readyReplicas"] = 1
    results = []
    for i in range(6):
        result = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=5 * i), fetch=saturated_draft)
        results.append(result)
        body["status"].update(result.status_patch)
        if kube.draft_swaps:
            body["spec"]["draft"]["replicas"] = kube.draft_swaps[-1][1]
    assert kube.draft_swaps == [(1, 2)]
    assert kube.swaps == []  # more drafts, not more targets
    changed = [r for r in results if any(e.reason == c.EVENT_REBALANCED for e in r.events)]
    assert len(changed) == 1
    last = changed[0].status_patch["drafts"]["lastRebalance"]
    assert (last["from"], last["to"]) == (1, 2)


def gpu_refusing_pod(pool: str, node: str) -> dict[str, Any]:
    said = cuda_refusal("cuda", torch_version="2.9.0+cpu", cuda_build=None, visible=0, node=node)
    pod = f.pod(
        f"chat-target-{pool}-0",
        c.COMPONENT_TARGET,
        pool,
        phase="Running",
        containerStatuses=[
            {
                "name": c.COMPONENT_TARGET,
                "ready": False,
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": said}},
            }
        ],
    )
    pod.update(kind="Pod")
    pod["metadata"].update(
        namespace=f.OWNER.namespace, labels={**pod["metadata"]["labels"], c.LABEL_MANAGED_BY: c.MANAGED_BY}
    )
    return pod


def test_a_pool_whose_pods_cannot_use_their_gpu_shows_in_status_and_one_warning_event() -> None:
    body = f.body()
    kube, memory = reconciled(body)
    kube.edit("StatefulSet", "ml", "chat-target-h100", lambda o: o["status"].update(readyReplicas=0))
    kube.put(gpu_refusing_pod("h100", "gpu-node-4"))
    result = controller.tick(kube, body, CONFIG, memory, now=T0, fetch=lambda _u: under_loaded(_u))
    targets_ready = conditions(result)[c.COND_TARGETS_READY]
    assert targets_ready["status"] == "False" and targets_ready["reason"] == "GPUUnusable"
    assert "pool h100" in targets_ready["message"] and "gpu-node-4" in targets_ready["message"]
    [event] = [e for e in result.events if e.reason == "GPUUnusable"]
    assert event.type == "Warning" and event.message.startswith("pool h100:") and "CPU-only build" in event.message
    again = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=30), fetch=under_loaded)
    assert [e for e in again.events if e.reason == "GPUUnusable"] == []  # once while it lasts
