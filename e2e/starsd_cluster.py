"""StarSDCluster helpers for the scenarios: the sample manifest, its children, and readiness."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from e2e.kube import Cluster, condition, wait_until

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "starsd-cluster.yaml"
MANAGED = "app.kubernetes.io/managed-by=starsd-operator"
# Fully qualified, so that kubectl never picks another group's resource of the same name or short name.
RESOURCE = "starsdclusters.starsd.io"


def sample(name: str = "chat") -> dict[str, Any]:
    """The shipped sample StarSDCluster (examples/starsd-cluster.yaml), renamed."""
    doc = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    doc["metadata"]["name"] = name
    return dict(doc)


def apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.apply(yaml.safe_dump(doc), namespace=namespace)


def get(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(cluster.get(RESOURCE, name, namespace))


def wait_ready(cluster: Cluster, namespace: str, name: str, replicas: int, timeout: float = 120) -> dict[str, Any]:
    """Waits until the cluster reports Ready with `replicas` ready targets for its current generation."""

    def ready() -> dict[str, Any] | None:
        obj = get(cluster, namespace, name)
        status = obj.get("status", {})
        ok = (
            (condition(obj, "Ready") or {}).get("status") == "True"
            and status.get("observedGeneration") == obj["metadata"]["generation"]
            and status.get("targets", {}).get("readyReplicas") == replicas
            and status.get("targets", {}).get("replicas") == replicas
        )
        return obj if ok else None

    try:
        return wait_until(f"StarSDCluster {namespace}/{name} Ready with {replicas} targets", ready, timeout)
    except AssertionError as exc:
        status = get(cluster, namespace, name).get("status")
        raise AssertionError(f"{exc}\nlast status: {yaml.safe_dump(status)}") from None


def statefulset_replicas(cluster: Cluster, namespace: str, name: str) -> dict[str, int]:
    """Pool name -> spec.replicas of that pool's StatefulSet (the drafts' StatefulSet has no pool)."""
    sets = cluster.get("statefulsets", namespace=namespace)
    return {
        s["metadata"]["labels"]["starsd.io/pool"]: s["spec"]["replicas"]
        for s in sets
        if s["metadata"]["labels"].get("app.kubernetes.io/instance") == name
        and s["metadata"]["labels"].get("app.kubernetes.io/component") == "target"
    }


def children(cluster: Cluster, namespace: str, name: str) -> dict[str, list[str]]:
    """kind -> sorted names of every object the operator manages for this cluster, and their pods."""
    selector = f"app.kubernetes.io/instance={name},{MANAGED}"
    return {
        kind: sorted(i["metadata"]["name"] for i in cluster.get(kind, namespace=namespace, selector=selector))
        for kind in ("deployments", "statefulsets", "services", "networkpolicies", "pods")
    }
