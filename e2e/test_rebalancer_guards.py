"""The rebalancer on a shared cluster: idle targets scale in, a pod that never schedules does not freeze it
(the convergence timeout), an HPA makes it step aside, the load-url annotation is refused unless the operator
allows it, and an idle cluster's status is not rewritten every tick.

A real `starsd draft` (emulated 4 ms service time) runs on loopback with emulated targets whose batch
occupancy is chosen per test (each runs one session in a batch of ``max_num_seqs``)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import yaml

from e2e import starsd_cluster as ssd
from e2e.emulated_load import EmulatedLoad
from e2e.kube import Cluster, condition, wait_until
from e2e.operator_process import OperatorProcess
from starsd.local import LocalStar


def events(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    found = cluster.get("events", namespace=namespace)
    return [e for e in found if e.get("reason") == reason and e["involvedObject"]["name"] == "chat"]


def autoscaled(load_url: str, replicas: int, **autoscaling: Any) -> dict[str, Any]:
    doc = ssd.sample("chat")
    doc["metadata"]["annotations"] = {"starsd.io/load-url": load_url}
    doc["spec"]["targets"]["replicas"] = replicas
    doc["spec"]["autoscaling"].update(
        enabled=True,
        minTargets=1,
        maxTargets=8,
        scaleUp={"stabilizationWindowSeconds": 5, "maxStep": 4},
        scaleDown={"stabilizationWindowSeconds": 5, "maxStep": 2},
        **autoscaling,
    )
    return doc


def test_idle_targets_scale_in_to_min_targets(
    cluster: Cluster, operator: OperatorProcess, namespace: str, draft: LocalStar
) -> None:
    load = EmulatedLoad(draft.draft_address, sessions=2, max_num_seqs=64)  # occupancy 1/64: idle
    load.start()
    try:
        ssd.apply(cluster, namespace, autoscaled(draft.load_url, replicas=5))

        def scaled_in() -> dict[str, Any] | None:
            obj = ssd.get(cluster, namespace, "chat")
            return obj if obj["spec"]["targets"]["replicas"] == 1 else None

        wait_until("idle targets to scale in to minTargets", scaled_in, timeout=120, interval=1)
        rebalanced = events(cluster, namespace, "Rebalanced")
        assert rebalanced and all("targets idle" in e["message"] for e in rebalanced), rebalanced
        assert ssd.get(cluster, namespace, "chat")["status"]["lastRebalance"]["reason"] == "TargetsIdle"
    finally:
        load.stop()


def test_a_pod_that_never_schedules_stops_blocking_after_the_convergence_timeout(
    cluster: Cluster, operator: OperatorProcess, namespace: str, draft: LocalStar
) -> None:
    load = EmulatedLoad(draft.draft_address, sessions=2, max_num_seqs=2)  # occupancy 0.5: hold
    load.start()
    try:
        doc = autoscaled(draft.load_url, replicas=3, convergenceTimeoutSeconds=20)
        h100 = doc["spec"]["pools"][0]
        nowhere = {**h100, "name": "nowhere", "weight": 1, "minReplicas": 1, "maxReplicas": 1}
        nowhere["nodeSelector"] = {"starsd.io/pool": "nowhere"}  # no node has it: one pod stays Pending
        doc["spec"]["pools"] = [h100, nowhere]
        ssd.apply(cluster, namespace, doc)

        def reason_is(wanted: str, saying: str = "") -> dict[str, Any] | None:
            cond = condition(ssd.get(cluster, namespace, "chat"), "Rebalancing") or {}
            return cond if cond.get("reason") == wanted and saying in cond.get("message", "") else None

        wait_until(
            "the rebalancer to wait for the targets", lambda: reason_is("NotConverged", "of 3 ready"), timeout=60
        )
        timed_out = wait_until("the convergence timeout", lambda: reason_is("ConvergenceTimeout"), timeout=60)
        assert "deciding on the ready count" in timed_out["message"]
        assert "chat-target-nowhere-0" in timed_out["message"] and "cannot be scheduled" in timed_out["message"]
    finally:
        load.stop()


def test_an_hpa_on_the_cluster_makes_the_rebalancer_step_aside(
    cluster: Cluster, operator: OperatorProcess, namespace: str, draft: LocalStar
) -> None:
    load = EmulatedLoad(draft.draft_address, sessions=4)  # saturated targets: it would scale up
    load.start()
    try:
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "chat-hpa"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "starsd.io/v1alpha1", "kind": "StarSDCluster", "name": "chat"},
                "minReplicas": 2,
                "maxReplicas": 2,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}],
            },
        }
        hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] = 80
        cluster.apply(yaml.safe_dump(hpa), namespace=namespace)
        ssd.apply(cluster, namespace, autoscaled(draft.load_url, replicas=2))

        def stepped_aside() -> dict[str, Any] | None:
            cond = condition(ssd.get(cluster, namespace, "chat"), "Rebalancing") or {}
            return cond if cond.get("reason") == "ExternalAutoscaler" else None

        cond = wait_until("Rebalancing=False ExternalAutoscaler", stepped_aside, timeout=60)
        assert cond["status"] == "False" and "chat-hpa" in cond["message"]
        time.sleep(12)  # longer than the up window: the rebalancer would have moved by now
        assert ssd.get(cluster, namespace, "chat")["spec"]["targets"]["replicas"] == 2
        assert events(cluster, namespace, "Rebalanced") == []
        warned = events(cluster, namespace, "ExternalAutoscaler")
        assert len(warned) == 1 and warned[0]["type"] == "Warning" and warned[0].get("count", 1) == 1, warned
    finally:
        load.stop()


class Recorder(BaseHTTPRequestHandler):
    """A server the annotation points at: it records every request it gets."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(500)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_the_load_url_annotation_is_refused_by_default(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    operator.stop()
    plain = OperatorProcess(cluster, operator.kubeconfig, operator.env)  # the chart's default: no flag
    plain.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/internal/secrets"
        ssd.apply(cluster, namespace, autoscaled(url, replicas=2))
        warned = wait_until(
            "a LoadURLIgnored Warning", lambda: events(cluster, namespace, "LoadURLIgnored") or None, timeout=60
        )
        assert "--allow-load-url-annotation" in warned[0]["message"]
        time.sleep(5)
        assert Recorder.seen == []
        cond = condition(ssd.get(cluster, namespace, "chat"), "Rebalancing") or {}
        assert "127.0.0.1" not in cond.get("message", "")
    finally:
        plain.stop()
        operator.start()
        server.shutdown()


def writes_during(cluster: Cluster, namespace: str, seconds: float) -> int:
    """How many times the object ``namespace/chat`` changed (its resourceVersion moved) over ``seconds``;
    every PATCH the operator sends changes something (it sends none otherwise)."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        version = ssd.get(cluster, namespace, "chat")["metadata"]["resourceVersion"]
        if not seen or seen[-1] != version:
            seen.append(version)
        time.sleep(0.25)
    return len(seen) - 1


def test_an_idle_cluster_is_written_about_once_a_minute(
    cluster: Cluster, operator: OperatorProcess, namespace: str, draft: LocalStar
) -> None:
    load = EmulatedLoad(draft.draft_address, sessions=2, max_num_seqs=2)  # steady: nothing to decide
    load.start()
    try:
        doc = autoscaled(draft.load_url, replicas=2)
        doc["spec"]["autoscaling"] = {"enabled": False}
        ssd.apply(cluster, namespace, doc)
        ssd.wait_ready(cluster, namespace, "chat", replicas=2)
        time.sleep(30)  # the draft's 10 s window fills with the steady load: its utilisation settles
        writes = writes_during(cluster, namespace, 60)
        print(f"writes of an idle StarSDCluster in 60 s (operator ticking every second): {writes}")
        assert writes <= 2, writes
    finally:
        load.stop()
