"""The operator keeps what it owns, on the real control plane: every child deleted by hand comes back with a
``Repaired`` Event within seconds, a pool scaled or edited by hand is put back; a saturated draft with waiting
requests keeps its targets; ``minTargets: 0`` is refused; a pool waiting for a node is not a failed rollout;
a load that hovers at a threshold does not rewrite the status every tick.

The repair times (5 tries per child) and the status writes are printed (``pytest -s``) and written to
``.cluster/logs/level-triggered.json``.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, condition, wait_until
from e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.usefixtures("operator")

REPAIR_DEADLINE = 15.0  # seconds: what the operator promises for a deleted or edited child
TRIES = 5
# Every child of a 3-target cluster of the sample (h100 2, l4 1): (kubectl resource, name, kind).
CHILDREN = [
    ("services", "chat", "Service"),  # the client Service
    ("services", "chat-draft", "Service"),
    ("services", "chat-draft-pods", "Service"),
    ("services", "chat-target-h100", "Service"),  # a pool's headless Service
    ("networkpolicies.networking.k8s.io", "chat-draft", "NetworkPolicy"),
    ("poddisruptionbudgets.policy", "chat-draft", "PodDisruptionBudget"),
    ("poddisruptionbudgets.policy", "chat-target-h100", "PodDisruptionBudget"),
    ("poddisruptionbudgets.policy", "chat-target-l4", "PodDisruptionBudget"),
    ("deployments.apps", "chat-draft", "Deployment"),
    ("statefulsets.apps", "chat-target-l4", "StatefulSet"),
]
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def record(cluster: Cluster) -> Iterator[None]:
    yield
    if RESULTS:
        path = cluster.state_dir / "logs" / "level-triggered.json"
        path.write_text(json.dumps(RESULTS, indent=2))
        print(f"\nmeasurements: {path}\n{json.dumps(RESULTS, indent=2)}")


def plain(name: str = "chat", replicas: int = 3) -> dict[str, Any]:
    doc = ssd.sample(name)
    doc["spec"]["autoscaling"] = {"enabled": False}
    doc["spec"]["targets"]["replicas"] = replicas
    return doc


def repaired_events(cluster: Cluster, namespace: str, message: str) -> list[dict[str, Any]]:
    found = cluster.get("events", namespace=namespace)
    return [
        e
        for e in found
        if e.get("reason") == "Repaired" and e["involvedObject"]["name"] == "chat" and e.get("message") == message
    ]


def uid(cluster: Cluster, namespace: str, resource: str, name: str) -> str | None:
    proc = cluster.kubectl(
        "get", resource, name, "-n", namespace, "-o", "jsonpath={.metadata.uid}", check=False, timeout=30
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def test_every_deleted_child_comes_back_with_its_event(cluster: Cluster, namespace: str) -> None:
    ssd.apply(cluster, namespace, plain())
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    times: dict[str, list[float]] = {}
    for resource, name, kind in CHILDREN:
        for _ in range(TRIES):
            before = uid(cluster, namespace, resource, name)
            assert before, f"{kind} {name} does not exist"
            cluster.kubectl("delete", resource, name, "-n", namespace)
            gone = time.monotonic()

            def back(r: str = resource, n: str = name, old: str = before) -> str | None:
                new = uid(cluster, namespace, r, n)
                return new if new and new != old else None

            wait_until(f"{kind} {name} to come back", back, timeout=REPAIR_DEADLINE, interval=0.1)
            times.setdefault(f"{kind} {name}", []).append(time.monotonic() - gone)
        message = f"{kind} {name} was missing"
        wait_until(f"the Event '{message}'", lambda m=message: repaired_events(cluster, namespace, m) or None, 15)
    RESULTS["repair_seconds"] = {
        what: {"median": round(statistics.median(ts), 2), "max": round(max(ts), 2), "tries": len(ts)}
        for what, ts in times.items()
    }


def test_a_pool_scaled_by_hand_is_scaled_back(cluster: Cluster, namespace: str) -> None:
    ssd.apply(cluster, namespace, plain())
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    times = []
    for _ in range(TRIES):
        cluster.kubectl("scale", "statefulset", "chat-target-h100", "--replicas=99", "-n", namespace)
        started = time.monotonic()
        wait_until(
            "the pool back at 2 replicas",
            lambda: ssd.statefulset_replicas(cluster, namespace, "chat").get("h100") == 2 or None,
            timeout=REPAIR_DEADLINE,
            interval=0.1,
        )
        times.append(time.monotonic() - started)
    RESULTS["scale_back_seconds"] = {"median": round(statistics.median(times), 2), "max": round(max(times), 2)}
    message = "StatefulSet chat-target-h100 drifted: spec.replicas"
    wait_until("its Repaired Event", lambda: repaired_events(cluster, namespace, message) or None, 15)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)


def test_a_hand_edited_image_and_command_are_restored(cluster: Cluster, namespace: str) -> None:
    ssd.apply(cluster, namespace, plain())
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)

    def container() -> dict[str, Any]:
        sts = cluster.get("statefulsets", "chat-target-l4", namespace)
        return dict(sts["spec"]["template"]["spec"]["containers"][0])

    image, command = container()["image"], container()["command"]
    edit = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil/target:latest"},
        {"op": "add", "path": "/spec/template/spec/containers/0/command/-", "value": "--debug"},
    ]
    cluster.kubectl("patch", "statefulset", "chat-target-l4", "-n", namespace, "--type=json", "-p", json.dumps(edit))
    started = time.monotonic()
    wait_until(
        "the image and command restored",
        lambda: (lambda now: (now["image"], now["command"]) == (image, command) or None)(container()),
        timeout=REPAIR_DEADLINE,
        interval=0.2,
    )
    RESULTS["edit_restored_seconds"] = round(time.monotonic() - started, 2)

    def drifted() -> list[dict[str, Any]] | None:
        found = cluster.get("events", namespace=namespace)
        return [
            e
            for e in found
            if e.get("reason") == "Repaired" and "StatefulSet chat-target-l4 drifted" in e.get("message", "")
        ] or None

    [event, *_] = wait_until("its Repaired Event", drifted, 15)
    assert "containers[target].image" in event["message"] and "containers[target].command" in event["message"]


def test_min_targets_zero_is_refused_with_why(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("zero")
    doc["spec"]["autoscaling"].update(enabled=True, minTargets=0)
    doc["spec"]["targets"]["replicas"] = 1
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0
    assert "minTargets must be at least 1: with no target, nothing reports demand" in proc.stderr, proc.stderr


class LoadServer:
    """A ``/v1/load`` on loopback that answers with ``reading(n)`` for its n-th request."""

    def __init__(self, reading: Callable[[int], dict[str, Any]]) -> None:
        served = [0]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(reading(served[0])).encode()
                served[0] += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.served = served
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/load"

    def __enter__(self) -> LoadServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()


def reading(**over: Any) -> dict[str, Any]:
    base = {
        "utilization": 0.3,
        "window_seconds": 10.0,
        "tq_seconds": 0.004,
        "tp_seconds": 0.02,
        "tc_seconds": 0.001,
        "queue_depth": 0,
        "targets": 3,
        "regime": "UnderLoaded",
        "active_sessions": 20,
        "recommended_targets": 7,
        "running_requests": 96,
        "waiting_requests": 0,
        "target_occupancy": 0.5,
    }
    return {**base, **over}


def autoscaled(load_url: str, replicas: int, **autoscaling: Any) -> dict[str, Any]:
    doc = plain(replicas=replicas)
    doc["metadata"]["annotations"] = {"starsd.io/load-url": load_url}
    doc["spec"]["autoscaling"] = {
        "enabled": True,
        "minTargets": 1,
        "maxTargets": 8,
        "scaleUp": {"stabilizationWindowSeconds": 5, "maxStep": 4},
        "scaleDown": {"stabilizationWindowSeconds": 5, "maxStep": 2},
        **autoscaling,
    }
    return doc


def test_a_saturated_draft_with_waiting_requests_keeps_its_targets(cluster: Cluster, namespace: str) -> None:
    """The draft is saturated (queue 3, utilisation .95, N* 2) while 50 requests wait at the 4 targets."""
    saturated = reading(
        utilization=0.95, queue_depth=3, regime="FullyLoaded", recommended_targets=2, targets=4,
        waiting_requests=50, target_occupancy=1.0, running_requests=256,
    )  # fmt: skip
    with LoadServer(lambda _n: saturated) as load:
        ssd.apply(cluster, namespace, autoscaled(load.url, replicas=4))
        ssd.wait_ready(cluster, namespace, "chat", replicas=4)

        def holding() -> dict[str, Any] | None:
            cond = condition(ssd.get(cluster, namespace, "chat"), "Rebalancing") or {}
            return cond if "wait at the targets" in cond.get("message", "") else None

        cond = wait_until("the rebalancer to hold for the waiting requests", holding, timeout=30)
        assert "50 requests wait at the targets" in cond["message"]
        time.sleep(15)  # three scale-down windows: before, 4 -> 2 within one
        obj = ssd.get(cluster, namespace, "chat")
        assert obj["spec"]["targets"]["replicas"] == 4
        assert [e for e in cluster.get("events", namespace=namespace) if e.get("reason") == "Rebalanced"] == []


def test_a_pool_waiting_for_a_node_is_rolling_not_halted(cluster: Cluster, namespace: str) -> None:
    doc = plain()
    ssd.apply(cluster, namespace, doc)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    # The l4 pool moves to nodes that do not exist yet (as if the cluster autoscaler had to add them).
    doc["spec"]["pools"][1]["nodeSelector"] = {"starsd.io/pool": "l4-next"}
    ssd.apply(cluster, namespace, doc)

    def rollout() -> dict[str, Any]:
        pools = ssd.get(cluster, namespace, "chat").get("status", {}).get("targets", {}).get("pools") or []
        return next((p.get("rollout") or {} for p in pools if p.get("name") == "l4"), {})

    waiting = wait_until(
        "the l4 rollout to wait for a node",
        lambda: rollout() if "waits to be scheduled" in rollout().get("message", "") else None,
        timeout=60,
    )
    assert waiting["state"] == "Rolling", waiting
    time.sleep(10)
    assert rollout()["state"] == "Rolling"
    warnings = [
        e
        for e in cluster.get("events", namespace=namespace)
        if e.get("type") == "Warning" and e["involvedObject"]["kind"] == "StarSDCluster"
    ]
    assert warnings == [], warnings  # the scheduler's FailedScheduling on the pod is its own, not the operator's
    cond = condition(ssd.get(cluster, namespace, "chat"), "RolloutProgressing") or {}
    assert cond.get("status") == "True", cond


def writes_during(cluster: Cluster, namespace: str, seconds: float) -> int:
    """How many times ``namespace/chat`` changed (its resourceVersion moved) over ``seconds``."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        version = ssd.get(cluster, namespace, "chat")["metadata"]["resourceVersion"]
        if not seen or seen[-1] != version:
            seen.append(version)
        time.sleep(0.25)
    return len(seen) - 1


def test_a_load_swinging_at_a_threshold_is_written_about_once_a_minute(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """Every other reading asks for more targets (Stabilizing: never for a whole 30 s up window), the others
    hold (Balanced); the operator ticks every second, so the reason would flip every tick."""
    wants_more = reading(waiting_requests=4, target_occupancy=0.9)
    steady = reading()
    with LoadServer(lambda n: wants_more if n % 2 else steady) as load:
        doc = autoscaled(load.url, replicas=3, scaleUp={"stabilizationWindowSeconds": 30, "maxStep": 4})
        ssd.apply(cluster, namespace, doc)
        ssd.wait_ready(cluster, namespace, "chat", replicas=3)
        time.sleep(5)
        before = operator.metrics()
        writes = writes_during(cluster, namespace, 60)
        after = operator.metrics()
        assert load.served[0] >= 40  # it was read about every tick
        assert ssd.get(cluster, namespace, "chat")["spec"]["targets"]["replicas"] == 3

    def delta(prefix: str) -> float:
        return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))

    ticks = delta('starsd_operator_reconciles_total{handler="tick"}')
    requests = delta("starsd_operator_api_requests_total")
    reasons = {k: v - before.get(k, 0.0) for k, v in after.items() if k.startswith("starsd_operator_rebalancer_")}
    RESULTS["swinging_load"] = {
        "status_writes_per_minute": writes,
        "ticks": ticks,
        "operator_api_requests_per_tick": round(requests / ticks, 3) if ticks else None,
        "decisions": reasons,
    }
    assert writes <= 2, writes
