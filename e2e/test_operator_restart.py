"""Issue 4's scenario 5: the operator is killed (SIGKILL) in the middle of reconciling, the spec changes while
it is down, and a new operator process converges: exactly the wanted children, each owned by the cluster,
nothing duplicated and nothing orphaned."""

from __future__ import annotations

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until
from e2e.operator_process import OperatorProcess


def test_operator_killed_mid_reconcile_converges_after_restart(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    doc = ssd.sample("chat")
    ssd.apply(cluster, namespace, doc)
    try:
        # Kill as soon as the first child exists: the reconcile is under way, not finished.
        wait_until(
            "the operator to start creating children",
            lambda: (
                ssd.children(cluster, namespace, "chat")["statefulsets"]
                or ssd.children(cluster, namespace, "chat")["services"]
            ),
            timeout=60,
            interval=0.05,
        )
        operator.kill()
        # While no operator runs: drop a pool and resize. Its StatefulSet must not be left behind.
        doc["spec"]["pools"] = [p for p in doc["spec"]["pools"] if p["name"] == "h100"]
        doc["spec"]["targets"]["replicas"] = 3
        ssd.apply(cluster, namespace, doc)
    finally:
        operator.start()

    obj = ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    assert ssd.statefulset_replicas(cluster, namespace, "chat") == {"h100": 3}
    wait_until(
        "the dropped pool's pods to be gone",
        lambda: len(ssd.children(cluster, namespace, "chat")["pods"]) == 3 + 1,
        timeout=60,
    )
    found = ssd.children(cluster, namespace, "chat")
    assert found["deployments"] == ["chat-draft"]
    assert found["statefulsets"] == ["chat-target-h100"]
    assert found["services"] == ["chat", "chat-draft", "chat-draft-pods", "chat-target-h100"]

    uid = obj["metadata"]["uid"]
    for kind in ("deployments", "statefulsets", "services", "networkpolicies"):
        for child in cluster.get(kind, namespace=namespace):
            refs = child["metadata"].get("ownerReferences", [])
            assert [(r["kind"], r["uid"]) for r in refs] == [("StarSDCluster", uid)], (kind, child["metadata"]["name"])
