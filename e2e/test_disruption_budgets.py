"""PodDisruptionBudgets on the real control plane: one for the draft and one per pool with replicas, that the
disruption controller fills with the right pods, and that follow the pool's replicas down to none and back."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until

pytestmark = pytest.mark.usefixtures("operator")


def budgets(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.get("poddisruptionbudgets.policy", namespace=namespace)}


def expect(cluster: Cluster, namespace: str, pods: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Wait until exactly the budgets in ``pods`` exist, each counting that many pods, all healthy (the
    disruption controller's view)."""

    def settled() -> dict[str, dict[str, Any]] | None:
        found = budgets(cluster, namespace)
        counted = {name: (p.get("status") or {}).get("expectedPods") for name, p in found.items()}
        healthy = {name: (p.get("status") or {}).get("currentHealthy") for name, p in found.items()}
        return found if counted == pods == healthy else None

    return wait_until(f"budgets {pods}", settled, timeout=90)


def test_budgets_exist_count_their_pods_and_follow_the_replicas(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("pdb")
    doc["spec"]["autoscaling"]["enabled"] = False
    doc["spec"]["targets"]["replicas"] = 3  # h100 2, l4 1
    doc["spec"]["pools"][0]["disruption"] = {"maxUnavailable": "50%"}
    ssd.apply(cluster, namespace, doc)

    found = expect(cluster, namespace, {"pdb-draft": 1, "pdb-target-h100": 2, "pdb-target-l4": 1})
    assert found["pdb-draft"]["spec"]["maxUnavailable"] == 1
    assert found["pdb-target-h100"]["spec"]["maxUnavailable"] == "50%"
    assert found["pdb-target-l4"]["status"]["disruptionsAllowed"] == 1

    cluster.kubectl("scale", ssd.RESOURCE, "pdb", "--replicas=1", "-n", namespace)  # h100 0 (l4 keeps its min 1)
    expect(cluster, namespace, {"pdb-draft": 1, "pdb-target-l4": 1})

    cluster.kubectl("scale", ssd.RESOURCE, "pdb", "--replicas=3", "-n", namespace)
    expect(cluster, namespace, {"pdb-draft": 1, "pdb-target-h100": 2, "pdb-target-l4": 1})

    # Several drafts: the draft's budget covers every draft pod and still lets one go at a time.
    patch = '{"spec":{"draft":{"replicas":3}}}'
    cluster.kubectl("patch", ssd.RESOURCE, "pdb", "-n", namespace, "--type=merge", "-p", patch)
    found = expect(cluster, namespace, {"pdb-draft": 3, "pdb-target-h100": 2, "pdb-target-l4": 1})
    assert found["pdb-draft"]["spec"]["maxUnavailable"] == 1
    assert found["pdb-draft"]["status"]["disruptionsAllowed"] == 1


def test_a_bad_max_unavailable_is_refused_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("pdbbad")
    doc["spec"]["pools"][0]["disruption"] = {"maxUnavailable": "0%"}
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0 and "maxUnavailable" in proc.stderr, proc.stderr
