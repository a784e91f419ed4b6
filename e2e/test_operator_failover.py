"""Operator high availability: two replicas peered through the chart's ClusterKopfPeering, one active and one
standing by; the active one is killed (SIGKILL, as when its node dies), and the standby reconciles a change
made after the kill within 30 s."""

from __future__ import annotations

import time

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until
from e2e.operator_process import RELEASE, OperatorProcess

PEERING = f"{RELEASE}-operator"  # the ClusterKopfPeering the chart installs (operator-ha.yaml)
TAKEOVER_SECONDS = 30


def test_the_standby_operator_takes_over_within_30_seconds(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    assert cluster.get("clusterkopfpeerings.kopf.dev", PEERING)["metadata"]["name"] == PEERING
    operator.stop()
    active, standby = (
        OperatorProcess(cluster, operator.kubeconfig, operator.env, (f"--peering={PEERING}", f"--priority={p}"), name)
        for p, name in ((200, "operator-active"), (100, "operator-standby"))
    )
    active.start()
    standby.start()
    try:
        # Both start paused; kopf resumes the highest priority only (the standby says nothing: it stays paused).
        wait_until("the active operator to resume", lambda: active.log_contains("Resuming operations"), timeout=60)
        wait_until("the standby to join the peering", lambda: standby.log_contains("Keep-alive in"), timeout=60)
        doc = ssd.sample("chat")
        doc["spec"]["targets"]["replicas"] = 2
        ssd.apply(cluster, namespace, doc)
        ssd.wait_ready(cluster, namespace, "chat", replicas=2)
        assert not standby.log_contains("Resuming operations"), "the standby reconciled beside the active one"

        active.kill()
        doc["spec"]["targets"]["replicas"] = 3
        ssd.apply(cluster, namespace, doc)
        changed = time.monotonic()
        wait_until(
            "the standby to reconcile the change",
            lambda: sum(ssd.statefulset_replicas(cluster, namespace, "chat").values()) == 3,
            timeout=TAKEOVER_SECONDS + 30,
            interval=0.5,
        )
        took = time.monotonic() - changed
        print(f"the standby reconciled a change made after the kill in {took:.1f} s")
        assert took <= TAKEOVER_SECONDS, took
        assert standby.log_contains("Resuming operations after the pause")
    finally:
        active.stop()
        standby.stop()
        operator.start()
