"""Issue 4's scenarios 1, 2, 6 and 7: apply the sample, resize it, change it, delete it; against the real API
server, controllers and scheduler, with the operator running as the chart's ServiceAccount."""

from __future__ import annotations

import json

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, condition_status, wait_until

pytestmark = pytest.mark.usefixtures("operator")


def node_pools(cluster: Cluster) -> dict[str, str | None]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get("starsd.io/pool") for n in cluster.get("nodes")}


def target_pods(cluster: Cluster, namespace: str, name: str) -> list[dict]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=target"
    return list(cluster.get("pods", namespace=namespace, selector=selector))


def test_sample_creates_every_child_on_its_pool_and_becomes_ready(cluster: Cluster, namespace: str) -> None:
    ssd.apply(cluster, namespace, ssd.sample("chat"))
    obj = ssd.wait_ready(cluster, namespace, "chat", replicas=6)

    found = ssd.children(cluster, namespace, "chat")
    assert found["deployments"] == ["chat-draft"]
    assert found["statefulsets"] == ["chat-target-h100", "chat-target-l4"]
    assert found["services"] == ["chat", "chat-draft", "chat-draft-pods", "chat-target-h100", "chat-target-l4"]
    assert ssd.statefulset_replicas(cluster, namespace, "chat") == {"h100": 4, "l4": 2}
    headless = cluster.get("service", "chat-target-h100", namespace)
    assert headless["spec"]["clusterIP"] == "None"

    pools = node_pools(cluster)
    for pod in target_pods(cluster, namespace, "chat"):
        assert pools[pod["spec"]["nodeName"]] == pod["metadata"]["labels"]["starsd.io/pool"], pod["metadata"]["name"]
    (draft_pod,) = cluster.get("pods", namespace=namespace, selector="app.kubernetes.io/component=draft")
    assert pools[draft_pod["spec"]["nodeName"]] == "l4"

    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert {p["name"]: p["readyReplicas"] for p in status["targets"]["pools"]} == {"h100": 4, "l4": 2}
    for kind in ("Ready", "DraftReady", "TargetsReady"):
        assert condition_status(obj, kind) == "True", kind
    for child in cluster.get("statefulsets", namespace=namespace) + cluster.get("deployments", namespace=namespace):
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("StarSDCluster", obj["metadata"]["uid"], True)


def test_replicas_are_split_by_weight_through_the_spec_and_the_scale_subresource(
    cluster: Cluster, namespace: str
) -> None:
    ssd.apply(cluster, namespace, ssd.sample("chat"))
    ssd.wait_ready(cluster, namespace, "chat", replicas=6)

    cluster.kubectl(
        "patch", ssd.RESOURCE, "chat", "-n", namespace, "--type=merge", "-p", '{"spec":{"targets":{"replicas":3}}}'
    )
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    assert ssd.statefulset_replicas(cluster, namespace, "chat") == {"h100": 2, "l4": 1}

    cluster.kubectl("scale", f"{ssd.RESOURCE}/chat", "--replicas=9", "-n", namespace)  # kubectl scale ssd/chat
    obj = ssd.wait_ready(cluster, namespace, "chat", replicas=9)
    assert ssd.statefulset_replicas(cluster, namespace, "chat") == {"h100": 6, "l4": 3}

    scale = json.loads(
        cluster.kubectl(
            "get", "--raw", f"/apis/starsd.io/v1alpha1/namespaces/{namespace}/starsdclusters/chat/scale"
        ).stdout
    )
    assert scale["spec"]["replicas"] == 9 and scale["status"]["replicas"] == 9
    selected = cluster.get("pods", namespace=namespace, selector=obj["status"]["selector"])
    owned_by_sets = [
        p
        for p in cluster.get("pods", namespace=namespace)
        if any(r["kind"] == "StatefulSet" for r in p["metadata"].get("ownerReferences", []))
        and p["metadata"]["labels"]["app.kubernetes.io/component"] == "target"
    ]
    assert sorted(p["metadata"]["name"] for p in selected) == sorted(p["metadata"]["name"] for p in owned_by_sets)
    assert len(selected) == 9


def test_deleting_the_cluster_garbage_collects_every_child(cluster: Cluster, namespace: str) -> None:
    ssd.apply(cluster, namespace, ssd.sample("chat"))
    ssd.wait_ready(cluster, namespace, "chat", replicas=6)
    assert all(ssd.children(cluster, namespace, "chat")[k] for k in ("statefulsets", "services", "pods"))

    cluster.kubectl("delete", ssd.RESOURCE, "chat", "-n", namespace, "--wait=false")
    wait_until(
        "the StarSDCluster and every child to be gone",
        lambda: (
            not cluster.get(ssd.RESOURCE, namespace=namespace)
            and not any(ssd.children(cluster, namespace, "chat").values())
        ),
        timeout=120,
    )
    assert cluster.get("replicasets", namespace=namespace) == []
    assert cluster.get("controllerrevisions", namespace=namespace) == []


def test_changing_the_target_model_rolls_the_target_pods(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("chat")
    doc["spec"]["targets"]["replicas"] = 3
    ssd.apply(cluster, namespace, doc)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in target_pods(cluster, namespace, "chat")}
    draft_before = [
        p["metadata"]["uid"]
        for p in cluster.get("pods", namespace=namespace, selector="app.kubernetes.io/component=draft")
    ]

    doc["spec"]["target"]["model"]["path"] = "/models/target-v2"
    ssd.apply(cluster, namespace, doc)

    def rolled() -> bool:
        pods = target_pods(cluster, namespace, "chat")
        return (
            len(pods) == 3
            and all(p["metadata"]["uid"] not in before.values() for p in pods)
            and all(
                "/models/target-v2"
                in " ".join(p["spec"]["containers"][0]["command"] + p["spec"]["containers"][0].get("args", []))
                for p in pods
            )
        )

    wait_until("every target pod to be replaced with the new model", rolled, timeout=120)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    draft_after = [
        p["metadata"]["uid"]
        for p in cluster.get("pods", namespace=namespace, selector="app.kubernetes.io/component=draft")
    ]
    assert draft_after == draft_before, "the draft did not change and must not restart"


def test_changing_a_pools_node_selector_moves_its_pods(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("chat")
    doc["spec"]["targets"]["replicas"] = 3
    ssd.apply(cluster, namespace, doc)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)

    # Move the l4 pool onto the h100 nodes (which needs their taint tolerated).
    l4 = next(p for p in doc["spec"]["pools"] if p["name"] == "l4")
    h100 = next(p for p in doc["spec"]["pools"] if p["name"] == "h100")
    l4["nodeSelector"] = {"starsd.io/pool": "h100"}
    l4["tolerations"] = h100["tolerations"]
    ssd.apply(cluster, namespace, doc)

    pools = node_pools(cluster)

    def moved() -> bool:
        pods = [p for p in target_pods(cluster, namespace, "chat") if p["metadata"]["labels"]["starsd.io/pool"] == "l4"]
        return bool(pods) and all(
            p["spec"].get("nodeName")
            and pools[p["spec"]["nodeName"]] == "h100"
            and condition_status(p, "Ready") == "True"
            for p in pods
        )

    wait_until("the l4 pool's pods to run on h100 nodes", moved, timeout=120)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
