"""The test cluster itself: fake GPU nodes, a CRD with CEL, the scheduler, kwok, RBAC and GC all work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.kube import Cluster, KubectlError, condition, condition_status, wait_until

MANIFESTS = Path(__file__).parent / "manifests"


def test_fake_gpu_nodes_in_two_pools_are_ready(cluster: Cluster) -> None:
    nodes = cluster.get("nodes")
    pools: dict[str, list[int]] = {}
    for node in nodes:
        assert condition_status(node, "Ready") == "True", node["metadata"]["name"]
        pool = node["metadata"]["labels"].get("starsd.io/pool")
        if pool:
            pools.setdefault(pool, []).append(int(node["status"]["allocatable"]["nvidia.com/gpu"]))
    assert set(pools) >= {"h100", "l4"}
    assert all(gpus and all(g > 0 for g in gpus) for gpus in pools.values())
    h100_taints = [
        n["spec"].get("taints", []) for n in nodes if n["metadata"]["labels"].get("starsd.io/pool") == "h100"
    ]
    assert h100_taints and all(
        any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in ts) for ts in h100_taints
    )


def test_every_fake_node_heartbeats_through_a_lease(cluster: Cluster) -> None:
    """Without leases the node lifecycle controller marks the nodes NotReady between kwok's status updates."""
    fake = {n["metadata"]["name"] for n in cluster.get("nodes")}

    def node_leases() -> list[dict[str, Any]] | None:
        leases = list(cluster.get("leases", namespace="kube-node-lease"))
        return leases if {le["metadata"]["name"] for le in leases} >= fake else None

    leases = wait_until("a lease per fake node", node_leases, timeout=30)
    for lease in leases:
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["spec"].get("renewTime"), lease["metadata"]["name"]


def test_server_version_is_the_built_release(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"].startswith("v1.34.")
    assert (version["major"], version["minor"]) == ("1", "34")


def test_crd_defaults_and_cel_rules_are_enforced(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", str(MANIFESTS / "widget-crd.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.e2e.starsd.io", "--timeout=30s")
    ok = "apiVersion: e2e.starsd.io/v1\nkind: Widget\nmetadata: {name: ok}\nspec: {max: 3}\n"
    cluster.apply(ok, namespace=namespace)
    assert cluster.get("widget", "ok", namespace)["spec"] == {"min": 1, "max": 3}
    bad = "apiVersion: e2e.starsd.io/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {min: 5, max: 3}\n"
    proc = cluster.apply(bad, namespace=namespace, check=False)
    assert proc.returncode != 0
    assert "min must not exceed max" in proc.stderr


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: gpu-app}
spec:
  replicas: 2
  selector: {matchLabels: {app: gpu-app}}
  template:
    metadata: {labels: {app: gpu-app}}
    spec:
      nodeSelector: {starsd.io/pool: h100}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      containers:
        - name: app
          image: registry.invalid/app:1
          resources: {limits: {nvidia.com/gpu: "1"}}
"""


def test_deployment_is_scheduled_on_its_pool_and_becomes_ready(cluster: Cluster, namespace: str) -> None:
    cluster.apply(DEPLOYMENT, namespace=namespace)
    cluster.kubectl("rollout", "status", "deployment/gpu-app", "-n", namespace, "--timeout=60s")
    pods = cluster.get("pods", namespace=namespace)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("fake-h100-"), pod["spec"]["nodeName"]
        assert condition_status(pod, "Ready") == "True"


def test_taint_keeps_pods_without_a_toleration_off_the_pool(cluster: Cluster, namespace: str) -> None:
    untolerated = DEPLOYMENT.replace("gpu-app", "no-toleration").replace(
        "      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n", ""
    )
    cluster.apply(untolerated, namespace=namespace)

    def unschedulable() -> bool:
        pods = cluster.get("pods", namespace=namespace)
        return bool(pods) and all((condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable" for p in pods)

    wait_until("the untolerated pods to be reported unschedulable", unschedulable, timeout=60)


def test_garbage_collector_removes_the_children_of_a_deleted_deployment(cluster: Cluster, namespace: str) -> None:
    cluster.apply(DEPLOYMENT, namespace=namespace)
    wait_until("the pods", lambda: len(cluster.get("pods", namespace=namespace)) == 2)
    cluster.kubectl("delete", "deployment", "gpu-app", "-n", namespace, "--cascade=background")
    wait_until(
        "the ReplicaSet and pods to be collected",
        lambda: not cluster.get("replicasets", namespace=namespace) and not cluster.get("pods", namespace=namespace),
        timeout=60,
    )


def test_rbac_refuses_a_service_account_without_permissions(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    subject = f"system:serviceaccount:{namespace}:nobody"
    proc = cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace, "--as", subject, check=False)
    assert proc.stdout.strip() == "no"
    try:
        cluster.kubectl("get", "pods", "-n", namespace, "--as", subject)
    except KubectlError as exc:
        assert "forbidden" in exc.stderr
    else:
        raise AssertionError("a service account without a role listed pods")
