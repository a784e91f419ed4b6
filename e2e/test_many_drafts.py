"""Several drafts on the real control plane (issue 21): ``spec.draft.replicas`` drafts are a StatefulSet whose
pods each have a DNS name (a headless Service), every target is given the list of all of them, and changing
the count moves only the targets the new draft takes. A cluster whose draft is still the Deployment of an
older operator gets the StatefulSet, and the Deployment goes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until
from e2e.operator_process import OperatorProcess
from starsd.assignment import ordered_drafts

pytestmark = pytest.mark.usefixtures("operator")

DRAFT = "app.kubernetes.io/component=draft"
TARGET = "app.kubernetes.io/component=target"


def endpoints(name: str, namespace: str, drafts: int) -> list[str]:
    """What the operator must give every target: each draft pod's DNS name and gRPC port, draft 0 first."""
    return [f"{name}-draft-{i}.{name}-draft-pods.{namespace}.svc:50051" for i in range(drafts)]


def draft_list(template_spec: dict[str, Any]) -> list[str]:
    [container] = [c for c in template_spec["containers"] if c["name"] == "target"]
    command = container["command"]
    return str(command[command.index("--draft") + 1]).split(",")


def pods(cluster: Cluster, namespace: str, name: str, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name},{component}"
    return sorted(cluster.get("pods", namespace=namespace, selector=selector), key=lambda p: p["metadata"]["name"])


def ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def target_sets(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    sets = cluster.get("statefulsets", namespace=namespace, selector=f"app.kubernetes.io/instance={name},{TARGET}")
    return {s["metadata"]["name"]: s for s in sets}


def first_choices(target_pods: list[dict[str, Any]], drafts: list[str]) -> dict[str, str]:
    """Each target pod's first-choice draft, as the target computes it from its own name (``--id $(POD_NAME)``)."""
    return {p["metadata"]["name"]: ordered_drafts(p["metadata"]["name"], drafts)[0] for p in target_pods}


def every_target_lists(cluster: Cluster, namespace: str, name: str, wanted: list[str]) -> bool:
    """The pools' templates and every running target pod carry exactly ``wanted``."""
    sets = target_sets(cluster, namespace, name)
    running = pods(cluster, namespace, name, TARGET)
    return (
        bool(sets)
        and all(draft_list(s["spec"]["template"]["spec"]) == wanted for s in sets.values())
        and all(draft_list(p["spec"]) == wanted for p in running)
    )


def test_three_drafts_for_nine_targets_and_a_fourth_moves_at_most_a_third(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("many")
    doc["spec"]["draft"]["replicas"] = 3
    # Nine targets in one pool (ordinals 0..8) on the h100 nodes; the drafts take l4 GPUs (at most 4 of 8).
    doc["spec"]["pools"] = [{**doc["spec"]["pools"][0], "maxReplicas": 12}]
    doc["spec"]["targets"]["replicas"] = 9
    doc["spec"]["autoscaling"].update(minDrafts=1, maxDrafts=4)  # the CEL rule: replicas within them
    ssd.apply(cluster, namespace, doc)
    obj = ssd.wait_ready(cluster, namespace, "many", replicas=9, timeout=180)

    sts = cluster.get("statefulset", "many-draft", namespace)
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "many-draft-pods"
    assert [ref["uid"] for ref in sts["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]]
    drafts = pods(cluster, namespace, "many", DRAFT)
    assert [p["metadata"]["name"] for p in drafts] == ["many-draft-0", "many-draft-1", "many-draft-2"]
    assert all(ready(p) for p in drafts)
    assert all(p["spec"]["subdomain"] == "many-draft-pods" for p in drafts)  # what gives each its DNS name
    assert cluster.get("deployments", namespace=namespace, selector=DRAFT) == []

    headless = cluster.get("service", "many-draft-pods", namespace)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"].get("publishNotReadyAddresses", False) is False
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    # The one-draft address stays, over any ready draft.
    assert cluster.get("service", "many-draft", namespace)["spec"]["type"] == "ClusterIP"

    three = endpoints("many", namespace, 3)
    assert set(target_sets(cluster, namespace, "many")) == {"many-target-h100"}
    assert every_target_lists(cluster, namespace, "many", three)
    targets = pods(cluster, namespace, "many", TARGET)
    assert len(targets) == 9
    before = first_choices(targets, three)
    assert sorted(before.values()) == sorted(three * 3)  # three targets on each draft

    counts = {k: obj["status"]["drafts"][k] for k in ("replicas", "ready", "desired", "readyOfDesired")}
    assert counts == {"replicas": 3, "ready": 3, "desired": 3, "readyOfDesired": "3/3"}
    # each draft pod's own load is read (here its DNS name does not resolve: the operator runs outside the cluster)
    assert [row["index"] for row in obj["status"]["drafts"]["loads"]] == [0, 1, 2]
    table = cluster.kubectl("get", ssd.RESOURCE, "many", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert row[header.index("DRAFTS")] == "3/3", table

    cluster.kubectl(
        "patch", ssd.RESOURCE, "many", "-n", namespace, "--type=merge", "-p", '{"spec":{"draft":{"replicas":4}}}'
    )
    four = endpoints("many", namespace, 4)
    # A new draft list is a new target template: the pools roll (kwok's pods are ready at once).
    wait_until(
        "every target pool and pod to list four drafts",
        lambda: every_target_lists(cluster, namespace, "many", four),
        timeout=180,
    )
    obj = ssd.wait_ready(cluster, namespace, "many", replicas=9, timeout=180)
    assert cluster.get("statefulset", "many-draft", namespace)["spec"]["replicas"] == 4
    wait_until(
        "four ready draft pods",
        lambda: (
            [p["metadata"]["name"] for p in pods(cluster, namespace, "many", DRAFT) if ready(p)]
            == [f"many-draft-{i}" for i in range(4)]
        ),
        timeout=60,
    )
    assert obj["status"]["drafts"]["readyOfDesired"] == "4/4"

    targets = pods(cluster, namespace, "many", TARGET)
    assert sorted(before) == sorted(p["metadata"]["name"] for p in targets)  # the same nine targets
    after = first_choices(targets, four)
    moved = {name for name in before if before[name] != after[name]}
    assert 1 <= len(moved) <= len(before) // 3, (before, after)
    assert {after[name] for name in moved} == {four[3]}  # only to the new draft; the others keep theirs


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    items = cluster.get("events", namespace=namespace)
    return [
        (e["type"], e["reason"], e["message"])
        for e in items
        if e["involvedObject"].get("kind") == "StarSDCluster" and e["involvedObject"].get("name") == name
    ]


def legacy_deployment(namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The draft Deployment an operator before several drafts made: its name, labels, owner and placement."""
    labels = {
        "app.kubernetes.io/name": "starsd",
        "app.kubernetes.io/instance": "legacy",
        "app.kubernetes.io/component": "draft",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
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
            "strategy": {"type": "Recreate"},
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


def test_an_old_draft_deployment_is_replaced_by_the_statefulset(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """What an operator upgrade meets: a cluster whose draft is a Deployment. The new operator applies the
    StatefulSet, then deletes the Deployment (an Event says so), and the cluster becomes Ready."""
    doc = ssd.sample("legacy")
    doc["spec"]["autoscaling"]["enabled"] = False
    doc["spec"]["targets"]["replicas"] = 3
    operator.kill()  # the old operator is gone; what it left is below
    try:
        ssd.apply(cluster, namespace, doc)
        owner = ssd.get(cluster, namespace, "legacy")
        cluster.apply(json.dumps(legacy_deployment(namespace, owner)), namespace=namespace)
        wait_until(
            "the old draft Deployment's pod to run",
            lambda: any(ready(p) for p in pods(cluster, namespace, "legacy", DRAFT)),
            timeout=60,
        )
    finally:
        operator.start()

    obj = ssd.wait_ready(cluster, namespace, "legacy", replicas=3, timeout=180)
    wait_until(
        "the old Deployment and its pod to be gone",
        lambda: (
            cluster.get("deployments", namespace=namespace, selector=DRAFT) == []
            and [p["metadata"]["name"] for p in pods(cluster, namespace, "legacy", DRAFT)] == ["legacy-draft-0"]
        ),
        timeout=90,
    )
    sts = cluster.get("statefulset", "legacy-draft", namespace)
    assert [ref["uid"] for ref in sts["metadata"]["ownerReferences"]] == [obj["metadata"]["uid"]]
    assert sts["status"]["readyReplicas"] == 1
    # Pinned images: the running draft's image carries over to the StatefulSet.
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "starsd/draft:0.0.9"
    deleted = wait_until(
        "the Deleted Event",
        lambda: [e for e in events(cluster, namespace, "legacy") if e[1] == "Deleted"] or None,
    )
    assert (
        "Normal",
        "Deleted",
        "deleted Deployment legacy-draft: the drafts run in StatefulSet legacy-draft now",
    ) in deleted
    assert operator.log_contains("deleting Deployment")


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
