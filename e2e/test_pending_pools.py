"""A pool whose nodeSelector matches no node: the real scheduler's reason reaches `kubectl describe ssd`, in
the pool's status and in TargetsReady with the pool named (docs/gpu-nodes.md)."""

from __future__ import annotations

from typing import Any

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, condition, wait_until

pytestmark = pytest.mark.usefixtures("operator")

MISSING_PRODUCT = "NVIDIA-B200"  # no fake node carries this nvidia.com/gpu.product


def with_a_pool_no_node_matches() -> dict[str, Any]:
    doc = ssd.sample("chat")
    h100 = doc["spec"]["pools"][0]
    b200 = {**h100, "name": "b200", "weight": 1, "minReplicas": 1, "maxReplicas": 2}
    b200["nodeSelector"] = {"nvidia.com/gpu.product": MISSING_PRODUCT}
    doc["spec"]["pools"] = [h100, b200]
    doc["spec"]["targets"]["replicas"] = 3
    doc["spec"]["autoscaling"]["enabled"] = False
    return doc


def test_a_pool_whose_pods_find_no_node_shows_the_schedulers_reason(cluster: Cluster, namespace: str) -> None:
    ssd.apply(cluster, namespace, with_a_pool_no_node_matches())

    def pending_pool() -> dict[str, Any] | None:
        pools = ssd.get(cluster, namespace, "chat").get("status", {}).get("targets", {}).get("pools", [])
        return next((p for p in pools if p["name"] == "b200" and "pending" in p), None)

    b200 = wait_until("the b200 pool's pending reason in the status", pending_pool, timeout=90, interval=1)
    pending = b200["pending"]
    assert pending["pods"] >= 1 and pending["reason"] == "Unschedulable"
    # The scheduler's own words: every node failed the selector (or a taint), none has a B200.
    assert pending["message"].startswith("0/") and "node affinity/selector" in pending["message"], pending

    obj = ssd.get(cluster, namespace, "chat")
    h100 = next(p for p in obj["status"]["targets"]["pools"] if p["name"] == "h100")
    assert "pending" not in h100  # the other pool is placed
    targets = condition(obj, "TargetsReady") or {}
    assert targets.get("status") == "False" and targets.get("reason") == "Unschedulable", targets
    assert (
        targets["message"].startswith("pool b200: ") and "chat-target-b200-0 cannot be scheduled" in targets["message"]
    )

    described = cluster.kubectl("describe", ssd.RESOURCE, "chat", "-n", namespace).stdout
    assert "pool b200: " in described and "node affinity/selector" in described
