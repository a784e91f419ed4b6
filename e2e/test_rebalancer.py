"""Issue 4's scenario 4: the rebalancer against a real draft server process.

A real `starsd draft` (emulated 4 ms service time) runs on loopback; emulated targets (starsd.bench) keep
sessions going through it with a 100 ms verify time, so the draft is under-loaded and the targets, each
running its one session, report a full batch. The StarSDCluster's `starsd.io/load-url` annotation (honoured
because the e2e operator runs with --allow-load-url-annotation) points the operator at that draft's /v1/load.
The operator must raise spec.targets.replicas toward N* (capped by maxStep and maxTargets), record it once
as an Event and in status.lastRebalance, and then hold while the load holds.
"""

from __future__ import annotations

import time

from e2e import starsd_cluster as ssd
from e2e.emulated_load import EmulatedLoad
from e2e.kube import Cluster, wait_until
from e2e.operator_process import OperatorProcess
from starsd.local import LocalStar

SESSIONS = 6  # emulated targets, one session each (Tp = 100 ms): N* = ceil(1 + 0.1/0.004) = 26, the draft ~23% busy
START_REPLICAS = 2
MAX_STEP = 4


def rebalanced_events(cluster: Cluster, namespace: str) -> list[dict]:
    events = cluster.get("events", namespace=namespace)
    return [e for e in events if e.get("reason") == "Rebalanced" and e["involvedObject"]["name"] == "chat"]


def test_rebalancer_raises_targets_of_an_under_loaded_draft_once_and_holds(
    cluster: Cluster, operator: OperatorProcess, namespace: str, draft: LocalStar
) -> None:
    load = EmulatedLoad(draft.draft_address, SESSIONS)
    load.start()
    try:
        doc = ssd.sample("chat")
        doc["metadata"]["annotations"] = {"starsd.io/load-url": draft.load_url}
        doc["spec"]["targets"]["replicas"] = START_REPLICAS
        doc["spec"]["autoscaling"].update(
            enabled=True,
            minTargets=1,
            maxTargets=SESSIONS,
            scaleUp={"stabilizationWindowSeconds": 5, "maxStep": MAX_STEP},
            scaleDown={"stabilizationWindowSeconds": 5, "maxStep": MAX_STEP},
        )
        ssd.apply(cluster, namespace, doc)

        def raised() -> dict | None:
            obj = ssd.get(cluster, namespace, "chat")
            return obj if obj["spec"]["targets"]["replicas"] != START_REPLICAS else None

        obj = wait_until("the rebalancer to change the target count", raised, timeout=150, interval=1)
        # Targets saturated (each emulated target runs its one session), draft under-loaded: up toward N* (26),
        # one capped step (2 + 4), which is also maxTargets.
        expected = min(SESSIONS, START_REPLICAS + MAX_STEP)
        assert obj["spec"]["targets"]["replicas"] == expected
        last = obj["status"]["lastRebalance"]
        assert (last["from"], last["to"], last["reason"]) == (START_REPLICAS, expected, "UnderLoaded")
        assert obj["status"]["recommendedTargets"] >= expected
        ssd.wait_ready(cluster, namespace, "chat", replicas=expected)

        # The load holds: the count must too, for longer than the draft's window plus stabilisation.
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            assert ssd.get(cluster, namespace, "chat")["spec"]["targets"]["replicas"] == expected, "flapped"
            time.sleep(1)
        events = rebalanced_events(cluster, namespace)
        assert len(events) == 1 and events[0].get("count", 1) == 1, events
        assert f"{START_REPLICAS}" in events[0]["message"] and f"{expected}" in events[0]["message"]
    finally:
        runs = load.stop()
    errors = [r.error for r in runs if r.error]
    assert not errors, errors
