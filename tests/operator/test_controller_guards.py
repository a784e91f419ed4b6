"""The tick's guards for a shared cluster: the load-url annotation only behind the operator's flag, an HPA
makes the rebalancer step aside, Ready needs the star connected, the convergence timeout names the pods that
block, and the status is written only on a real change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starsd_operator import churn, controller, naming
from starsd_operator import constants as c
from starsd_operator.controller import Config, Memory
from starsd_operator.rebalancer import Load

from . import factories as f
from .fakekube import FakeKube

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LOAD_URL = "http://127.0.0.1:7777/v1/load"
SERVICE_URL = "http://chat-draft.ml.svc:9090/v1/load"


def reading(*, targets: int = 3, utilization: float = 0.2, occupancy: float = 0.9, waiting: int = 4) -> Load:
    return Load(
        utilization=utilization,
        window_seconds=5,
        tq_seconds=0.004,
        tp_seconds=0.02,
        tc_seconds=0.001,
        queue_depth=0,
        targets=targets,
        regime="UnderLoaded",
        active_sessions=20,
        recommended_targets=7,
        running_requests=150,
        waiting_requests=waiting,
        target_occupancy=occupancy,
    )


def autoscaled(**auto: Any) -> dict[str, Any]:
    spec = f.spec(
        autoscaling={
            "enabled": True,
            "minTargets": 1,
            "maxTargets": 16,
            "scaleUp": {"stabilizationWindowSeconds": 0},
            "scaleDown": {"stabilizationWindowSeconds": 0},
            **auto,
        }
    )
    return f.body(spec, annotations={c.ANNOTATION_LOAD_URL: LOAD_URL})


def reconciled(body: dict[str, Any], config: Config) -> tuple[FakeKube, Memory]:
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, body, config, memory)
    kube.settle()
    body["status"]["observedGeneration"] = body["metadata"]["generation"]
    return kube, memory


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """Apply a JSON merge patch as the API server does (nested objects merged, None deletes)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in status.get("conditions", [])}


def test_the_annotation_is_ignored_by_default_and_said_once() -> None:
    body = autoscaled()
    config = Config()
    kube, memory = reconciled(body, config)
    urls: list[str] = []

    def fetch(url: str) -> Load:
        urls.append(url)
        return reading()

    results = [
        controller.tick(kube, body, config, memory, now=T0 + timedelta(seconds=5 * i), fetch=fetch) for i in range(3)
    ]
    assert set(urls) == {SERVICE_URL}
    warnings = [e for r in results for e in r.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == [c.EVENT_LOAD_URL_IGNORED]
    assert "--allow-load-url-annotation" in warnings[0].message


def test_the_annotation_is_read_when_the_operator_allows_it() -> None:
    body = autoscaled()
    config = Config(allow_load_url_annotation=True)
    kube, memory = reconciled(body, config)
    urls: list[str] = []

    def fetch(url: str) -> Load:
        urls.append(url)
        return reading()

    result = controller.tick(kube, body, config, memory, now=T0, fetch=fetch)
    assert urls == [LOAD_URL]
    assert not [e for e in result.events if e.type == "Warning"]


def hpa(target: str = "chat", kind: str = c.KIND, api_version: str = c.API_VERSION) -> dict[str, Any]:
    return {
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat-hpa", "namespace": "ml", "labels": {}},
        "spec": {"scaleTargetRef": {"apiVersion": api_version, "kind": kind, "name": target}},
    }


def test_an_hpa_on_the_cluster_makes_the_rebalancer_step_aside_with_one_warning() -> None:
    body = autoscaled()
    config = Config(allow_load_url_annotation=True)
    kube, memory = reconciled(body, config)
    kube.put(hpa())
    results = []
    for i in range(4):
        result = controller.tick(
            kube, body, config, memory, now=T0 + timedelta(seconds=5 * i), fetch=lambda _u: reading()
        )
        merge(body["status"], result.status_patch)
        results.append(result)
    assert kube.swaps == []
    rebalancing = conditions(body["status"])[c.COND_REBALANCING]
    assert (rebalancing["status"], rebalancing["reason"]) == ("False", "ExternalAutoscaler")
    assert "chat-hpa" in rebalancing["message"]
    warnings = [e for r in results for e in r.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["ExternalAutoscaler"]
    # Gone again: the rebalancer acts (zero windows) and a later HPA would be warned about anew.
    kube.delete("HorizontalPodAutoscaler", "ml", "chat-hpa")
    controller.tick(kube, body, config, memory, now=T0 + timedelta(seconds=30), fetch=lambda _u: reading())
    assert kube.swaps == [(3, 7)]
    assert "ExternalAutoscaler" not in memory.warned


def test_an_hpa_on_another_object_is_not_ours() -> None:
    body = autoscaled()
    config = Config(allow_load_url_annotation=True)
    kube, memory = reconciled(body, config)
    kube.put(hpa(target="other"))
    kube.objects[("HorizontalPodAutoscaler", "ml", "dep")] = {
        **hpa(kind="Deployment", api_version="apps/v1"),
        "metadata": {"name": "dep", "namespace": "ml", "labels": {}},
    }
    controller.tick(kube, body, config, memory, now=T0, fetch=lambda _u: reading())
    assert kube.swaps == [(3, 7)]


def test_ready_needs_the_ready_targets_connected_to_the_draft() -> None:
    body = f.body()
    config = Config()
    kube, memory = reconciled(body, config)
    result = controller.tick(kube, body, config, memory, now=T0, fetch=lambda _u: reading(targets=1))
    conds = conditions(result.status_patch)
    assert (conds[c.COND_STAR_CONNECTED]["status"], conds[c.COND_STAR_CONNECTED]["reason"]) == (
        "False",
        "TargetsNotConnected",
    )
    assert "1 of 3 ready targets connected" in conds[c.COND_STAR_CONNECTED]["message"]
    assert (conds[c.COND_READY]["status"], conds[c.COND_READY]["reason"]) == ("False", "TargetsNotConnected")
    assert result.status_patch["targets"]["connected"] == 1
    merge(body["status"], result.status_patch)
    result = controller.tick(kube, body, config, memory, now=T0 + timedelta(seconds=5), fetch=lambda _u: reading())
    conds = conditions(result.status_patch)
    assert conds[c.COND_STAR_CONNECTED]["status"] == "True" and conds[c.COND_READY]["status"] == "True"


def test_an_unreadable_load_leaves_star_connected_unknown_and_ready_on_the_pods() -> None:
    from starsd_operator.loadclient import LoadUnavailable

    def down(url: str) -> Load:
        raise LoadUnavailable(f"{url}: connection refused")

    body = f.body()
    config = Config()
    kube, memory = reconciled(body, config)
    conds = conditions(controller.tick(kube, body, config, memory, now=T0, fetch=down).status_patch)
    assert conds[c.COND_STAR_CONNECTED]["status"] == "Unknown"
    assert "connection refused" in conds[c.COND_STAR_CONNECTED]["message"]
    assert conds[c.COND_READY]["status"] == "True"


def test_the_convergence_timeout_decides_on_the_ready_count_and_names_the_blocking_pod() -> None:
    body = autoscaled(convergenceTimeoutSeconds=60)
    config = Config(allow_load_url_annotation=True)
    kube, memory = reconciled(body, config)
    sts = kube.objects[("StatefulSet", "ml", "chat-target-h100")]
    sts["status"]["readyReplicas"] -= 1  # one target never becomes ready
    unschedulable = f.pod(
        "chat-target-h100-1",
        c.COMPONENT_TARGET,
        "h100",
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    selector = naming.owned_selector(f.OWNER, c.COMPONENT_TARGET)
    unschedulable["metadata"]["labels"].update(part.split("=", 1) for part in selector.split(","))
    kube.put({**unschedulable, "kind": "Pod", "metadata": {**unschedulable["metadata"], "namespace": "ml"}})
    idle = reading(utilization=0.01, occupancy=0.0, waiting=0)
    for i in range(14):
        result = controller.tick(kube, body, config, memory, now=T0 + timedelta(seconds=5 * i), fetch=lambda _u: idle)
        merge(body["status"], result.status_patch)
        if kube.swaps:
            break
    assert kube.swaps == [(3, 1)]  # two ready, two down per step (scaleDown.maxStep): 3 -> 1
    rebalancing = conditions(body["status"])[c.COND_REBALANCING]
    assert rebalancing["reason"] == "ConvergenceTimeout"
    assert "2 of 3 targets ready after 60s" in rebalancing["message"]
    assert "Insufficient nvidia.com/gpu" in rebalancing["message"]


def test_an_idle_cluster_writes_its_status_at_most_once_a_minute() -> None:
    body = f.body()
    config = Config()
    kube, memory = reconciled(body, config)
    writes = 0
    for i in range(60):  # five minutes at one tick per 5 s, utilisation jittering by a point or two
        load = reading(utilization=0.2 + 0.01 * (i % 3))
        result = controller.tick(
            kube, body, config, memory, now=T0 + timedelta(seconds=5 * i), fetch=lambda _u, x=load: x
        )
        if result.status_patch:
            writes += 1
            merge(body["status"], result.status_patch)
    assert 5 <= writes <= 6  # the first write, then one refresh a minute


def test_a_real_change_is_written_at_once() -> None:
    old = {"draft": {"utilization": 0.2, "regime": "UnderLoaded"}, "conditions": [], "targets": {"readyReplicas": 3}}
    assert not churn.significant(old, {**old, "draft": {"utilization": 0.24, "regime": "UnderLoaded"}})
    assert churn.significant(old, {**old, "draft": {"utilization": 0.26, "regime": "UnderLoaded"}})
    assert churn.significant(old, {**old, "draft": {"utilization": 0.2, "regime": "FullyLoaded"}})
    assert churn.significant(old, {**old, "targets": {"readyReplicas": 2}})
    ready = {"type": "Ready", "status": "True", "reason": "Ready", "message": "a"}
    assert not churn.significant({**old, "conditions": [ready]}, {**old, "conditions": [{**ready, "message": "b"}]})
    assert churn.significant({**old, "conditions": [ready]}, {**old, "conditions": [{**ready, "status": "False"}]})
    assert churn.should_write(old, old, None, 0.0)
    assert not churn.should_write(old, old, 0.0, 59.0)
    assert churn.should_write(old, old, 0.0, 60.0)


def test_several_drafts_figures_are_refreshed_their_changes_written() -> None:
    row = {"index": 0, "utilization": 0.2, "regime": "UnderLoaded", "queueDepth": 0.0}
    old = {"drafts": {"ready": 2, "worstUtilization": 0.2, "loads": [row, {**row, "index": 1}]}, "conditions": []}

    def drafts(**changes: Any) -> dict[str, Any]:
        return {**old, "drafts": {**old["drafts"], **changes}}

    jitter = [{**row, "utilization": 0.23, "queueDepth": 0.4}, {**row, "index": 1}]
    assert not churn.significant(old, drafts(worstUtilization=0.23, loads=jitter))
    assert churn.significant(old, drafts(worstUtilization=0.3))
    assert churn.significant(old, drafts(ready=1))
    assert churn.significant(old, drafts(loads=[row, {"index": 1, "error": "connection refused"}]))
    assert churn.significant(old, drafts(loads=[row, {**row, "index": 1, "regime": "FullyLoaded"}]))


def test_a_load_swinging_across_balanced_and_stabilizing_writes_about_once_a_minute() -> None:
    """Every other reading argues for more targets (Stabilizing: the up window never holds it throughout), the
    others for holding (Balanced): the reason flips every tick, the count never moves."""
    body = autoscaled(scaleUp={"stabilizationWindowSeconds": 30})
    config = Config(allow_load_url_annotation=True)
    kube, memory = reconciled(body, config)
    saturated, steady = reading(occupancy=0.9, waiting=4), reading(occupancy=0.5, waiting=0)
    writes, reasons = 0, set()
    for i in range(60):  # five minutes, one tick per 5 s
        load = saturated if i % 2 else steady
        now = T0 + timedelta(seconds=5 * i)
        result = controller.tick(kube, body, config, memory, now=now, fetch=lambda _u, x=load: x)
        reasons.add(result.decision_reason)
        if result.status_patch:
            writes += 1
            merge(body["status"], result.status_patch)
    assert {"Balanced", "Stabilizing"} <= reasons and kube.swaps == []
    assert 5 <= writes <= 6, writes  # the first write, then one refresh a minute


def test_the_rebalancers_holding_reasons_are_one_and_its_moves_are_real_changes() -> None:
    def status(cond_status: str, reason: str) -> dict[str, Any]:
        return {"conditions": [{"type": "Rebalancing", "status": cond_status, "reason": reason, "message": "m"}]}

    assert not churn.significant(status("False", "Balanced"), status("False", "Stabilizing"))
    assert not churn.significant(status("False", "AtBound"), status("False", "RateLimited"))
    assert churn.significant(status("False", "Balanced"), status("True", "UnderLoaded"))
    assert churn.significant(status("False", "Balanced"), status("False", "LoadUnavailable"))
    ready = {"conditions": [{"type": "Ready", "status": "False", "reason": "Balanced"}]}
    assert churn.significant(ready, {"conditions": [{"type": "Ready", "status": "False", "reason": "Stabilizing"}]})
