"""Several drafts on the real control plane: ``spec.draft.replicas`` drafts are the pods of one Deployment,
listed (when ready) by a headless Service; every target is given that Service's name (``--drafts-from``), not a
list, so changing the draft count recreates no target pod. A draft image change rolls the drafts with surge (a
new draft is ready before the old one goes). A cluster whose drafts are still the StatefulSet of an older
operator gets the Deployment, and the StatefulSet goes once the Deployment is ready."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until
from e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.usefixtures("operator")

DRAFT = "app.kubernetes.io/component=draft"
TARGET = "app.kubernetes.io/component=target"


def drafts_from(template_spec: dict[str, Any]) -> str:
    [container] = [c for c in template_spec["containers"] if c["name"] == "target"]
    command = container["command"]
    assert "--draft" not in command
    return str(command[command.index("--drafts-from") + 1])


def pods(cluster: Cluster, namespace: str, name: str, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name},{component}"
    return sorted(cluster.get("pods", namespace=namespace, selector=selector), key=lambda p: p["metadata"]["name"])


def ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def ready_drafts(cluster: Cluster, namespace: str, name: str) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in pods(cluster, namespace, name, DRAFT)
        if ready(p) and not p["metadata"].get("deletionTimestamp")
    }


def listed_drafts(cluster: Cluster, namespace: str, service: str) -> set[str]:
    """The pods the headless Service's EndpointSlices list as ready (what its DNS name resolves to)."""
    slices = cluster.get(
        "endpointslices.discovery.k8s.io", namespace=namespace, selector=f"kubernetes.io/service-name={service}"
    )
    return {
        str((e.get("targetRef") or {}).get("name"))
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
    }


def target_uids(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster, namespace, name, TARGET)}


def scale_drafts(cluster: Cluster, namespace: str, name: str, drafts: int) -> None:
    patch = json.dumps({"spec": {"draft": {"replicas": drafts}}})
    cluster.kubectl("patch", ssd.RESOURCE, name, "-n", namespace, "--type=merge", "-p", patch)


def test_drafts_one_three_two_recreate_no_target_and_the_headless_service_lists_the_ready_ones(
    cluster: Cluster, namespace: str
) -> None:
    doc = ssd.sample("many")
    # Six targets in one pool on the h100 nodes; the drafts take l4 GPUs (at most 4 of 8, a surge included).
    doc["spec"]["pools"] = [{**doc["spec"]["pools"][0], "maxReplicas": 12}]
    doc["spec"]["targets"]["replicas"] = 6
    doc["spec"]["autoscaling"].update(minDrafts=1, maxDrafts=3)  # the CEL rule: replicas within them
    ssd.apply(cluster, namespace, doc)
    obj = ssd.wait_ready(cluster, namespace, "many", replicas=6, timeout=180)

    dep = cluster.get("deployment", "many-draft", namespace)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert [ref["uid"] for ref in dep["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]]
    assert cluster.get("statefulsets", namespace=namespace, selector=DRAFT) == []
    headless = cluster.get("service", "many-draft-pods", namespace)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"].get("publishNotReadyAddresses", False) is False
    assert headless["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert cluster.get("service", "many-draft", namespace)["spec"]["type"] == "ClusterIP"  # the one-draft address

    [pool] = cluster.get("statefulsets", namespace=namespace, selector=f"app.kubernetes.io/instance=many,{TARGET}")
    source = f"dns:many-draft-pods.{namespace}.svc:50051"
    assert drafts_from(pool["spec"]["template"]["spec"]) == source
    uids = target_uids(cluster, namespace, "many")
    assert len(uids) == 6 and all(drafts_from(p["spec"]) == source for p in pods(cluster, namespace, "many", TARGET))
    revision = pool["status"].get("updateRevision")

    for drafts in (3, 2):
        scale_drafts(cluster, namespace, "many", drafts)
        wait_until(
            f"{drafts} ready drafts, listed by the headless Service",
            lambda n=drafts: (
                len(r := ready_drafts(cluster, namespace, "many")) == n
                and listed_drafts(cluster, namespace, "many-draft-pods") == r
            ),
            timeout=120,
        )
        ssd.wait_ready(cluster, namespace, "many", replicas=6, timeout=120)
        want = {"replicas": drafts, "ready": drafts, "desired": drafts, "readyOfDesired": f"{drafts}/{drafts}"}
        seen: list[dict[str, Any]] = []

        def status_counts(want: dict[str, Any] = want, seen: list[dict[str, Any]] = seen) -> bool:
            # The status is written by the operator's next pass: it follows the Deployment within a tick or two.
            drafts_status = ssd.get(cluster, namespace, "many")["status"]["drafts"]
            seen.append({k: drafts_status.get(k) for k in want})
            return seen[-1] == want

        try:
            wait_until(f"status.drafts to count {drafts}", status_counts, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: last seen {seen[-1] if seen else None}") from exc
        # No target pod was recreated, and the pool's template did not move.
        assert target_uids(cluster, namespace, "many") == uids
        pool = cluster.get("statefulset", "many-target-h100", namespace)
        assert pool["status"].get("updateRevision") == revision
    table = cluster.kubectl("get", ssd.RESOURCE, "many", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert row[header.index("DRAFTS")] == "2/2", table


def test_a_draft_image_change_rolls_the_draft_with_surge(cluster: Cluster, namespace: str) -> None:
    """A new draft pod is ready before the old one is deleted: at every moment of the rollout at least one
    draft is ready and not terminating, and the old pod starts terminating only once a new one is ready."""
    doc = ssd.sample("surge")
    doc["spec"]["autoscaling"]["enabled"] = False
    doc["spec"]["targets"]["replicas"] = 2
    ssd.apply(cluster, namespace, doc)
    ssd.wait_ready(cluster, namespace, "surge", replicas=2, timeout=180)
    [old] = ready_drafts(cluster, namespace, "surge")
    uids = target_uids(cluster, namespace, "surge")

    patch = json.dumps({"spec": {"draft": {"image": "starsd/draft:surge-test"}}})
    cluster.kubectl("patch", ssd.RESOURCE, "surge", "-n", namespace, "--type=merge", "-p", patch)
    snapshots: list[dict[str, tuple[bool, bool]]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = {
            p["metadata"]["name"]: (ready(p), bool(p["metadata"].get("deletionTimestamp")))
            for p in pods(cluster, namespace, "surge", DRAFT)
        }
        snapshots.append(seen)
        if old not in seen and any(r and not t for r, t in seen.values()):
            break
        time.sleep(0.05)
    assert old not in snapshots[-1], f"the old draft {old} was not replaced: {snapshots[-1]}"
    for seen in snapshots:
        assert any(r and not t for r, t in seen.values()), f"no draft ready during the rollout: {seen}"
        if old not in seen or seen[old][1]:  # the old draft is leaving or gone
            assert any(r for name, (r, _) in seen.items() if name != old), f"left before a new one was ready: {seen}"
    assert target_uids(cluster, namespace, "surge") == uids  # a draft rollout recreates no target


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    items = cluster.get("events", namespace=namespace)
    return [
        (e["type"], e["reason"], e["message"])
        for e in items
        if e["involvedObject"].get("kind") == "StarSDCluster" and e["involvedObject"].get("name") == name
    ]


def legacy_statefulset(namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The draft StatefulSet an operator of the StatefulSet days made: its name, labels, owner and placement."""
    labels = {
        "app.kubernetes.io/name": "starsd",
        "app.kubernetes.io/instance": "legacy",
        "app.kubernetes.io/component": "draft",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "legacy-draft",
            "namespace": namespace,
            "labels": {**labels, "app.kubernetes.io/managed-by": "starsd-operator"},
            "ownerReferences": [
                {
                    "apiVersion": "starsd.io/v1alpha1",
                    "kind": "StarSDCluster",
                    "name": "legacy",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "replicas": 1,
            "serviceName": "legacy-draft-pods",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**labels, "app.kubernetes.io/managed-by": "starsd-operator"}},
                "spec": {
                    "nodeSelector": {"starsd.io/pool": "l4"},
                    "containers": [
                        {
                            "name": "draft",
                            "image": "starsd/draft:0.0.9",
                            "command": ["starsd", "draft", "--model", "/models/draft"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def test_an_old_draft_statefulset_is_replaced_by_the_deployment_without_a_gap(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """What an operator upgrade meets: a cluster whose drafts are a StatefulSet. The new operator applies the
    Deployment, and deletes the StatefulSet only once the Deployment's draft is ready (an Event says so)."""
    doc = ssd.sample("legacy")
    doc["spec"]["autoscaling"]["enabled"] = False
    doc["spec"]["targets"]["replicas"] = 3
    operator.kill()  # the old operator is gone; what it left is below
    try:
        ssd.apply(cluster, namespace, doc)
        owner = ssd.get(cluster, namespace, "legacy")
        cluster.apply(json.dumps(legacy_statefulset(namespace, owner)), namespace=namespace)
        wait_until(
            "the old draft StatefulSet's pod to run",
            lambda: ready_drafts(cluster, namespace, "legacy") == {"legacy-draft-0"},
            timeout=60,
        )
    finally:
        operator.start()

    # Until the StatefulSet is gone, some draft is always ready (the old one, then the new one too).
    def replaced() -> bool | None:
        assert ready_drafts(cluster, namespace, "legacy"), "no draft was ready during the upgrade"
        gone = cluster.get("statefulsets", namespace=namespace, selector=DRAFT) == []
        return gone or None

    wait_until("the old StatefulSet to be deleted", replaced, timeout=180, interval=0.2)
    obj = ssd.wait_ready(cluster, namespace, "legacy", replicas=3, timeout=180)
    wait_until(
        "the old draft pod to be gone",
        lambda: "legacy-draft-0" not in {p["metadata"]["name"] for p in pods(cluster, namespace, "legacy", DRAFT)},
        timeout=90,
    )
    dep = cluster.get("deployment", "legacy-draft", namespace)
    assert [ref["uid"] for ref in dep["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]]
    assert dep["status"]["readyReplicas"] == 1
    # Pinned images: the running draft's image carries over to the Deployment.
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "starsd/draft:0.0.9"
    deleted = wait_until(
        "the Deleted Event",
        lambda: [e for e in events(cluster, namespace, "legacy") if e[1] == "Deleted"] or None,
    )
    assert (
        "Normal",
        "Deleted",
        "deleted StatefulSet legacy-draft: the drafts run in Deployment legacy-draft now",
    ) in deleted
    assert operator.log_contains("deleting StatefulSet")


def test_the_api_server_keeps_the_draft_count_within_its_bounds(cluster: Cluster, namespace: str) -> None:
    """The CRD's CEL rules: minDrafts <= maxDrafts, and with autoscaling replicas within them."""
    doc = ssd.sample("bounds")
    doc["spec"]["draft"]["replicas"] = 3  # the sample enables autoscaling; maxDrafts defaults to 1
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0
    assert "draft.replicas (3) must be within autoscaling.minDrafts..maxDrafts (1..1)" in proc.stderr, proc.stderr

    doc["spec"]["autoscaling"].update(minDrafts=4, maxDrafts=2)
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0 and "autoscaling.minDrafts (4) must be <= maxDrafts (2)" in proc.stderr, proc.stderr

    doc["spec"]["draft"]["replicas"] = 33
    doc["spec"]["autoscaling"].update(minDrafts=1, maxDrafts=4)
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0 and "spec.draft.replicas" in proc.stderr, proc.stderr

    doc["spec"]["draft"]["replicas"] = 3  # the control: within 1..4
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode == 0, proc.stderr
    cluster.kubectl("delete", ssd.RESOURCE, "bounds", "-n", namespace, "--wait=false")
