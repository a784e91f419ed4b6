"""A change of the target model rolls one pool at a time (partitioned StatefulSet updates), and a pool whose
new pod fails halts the rollout and says so, on the real control plane (kwok's pods; a failing pod is one
whose status the test sets to a crash loop, as a kubelet would report it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, condition, wait_until

pytestmark = pytest.mark.usefixtures("operator")

V2, V3 = "/models/target-v2", "/models/target-v3"


def cluster_doc(name: str, min_ready_seconds: int) -> dict[str, Any]:
    doc = ssd.sample(name)
    doc["spec"]["autoscaling"]["enabled"] = False
    doc["spec"]["targets"]["replicas"] = 3  # h100 2, l4 1 (spec order: h100 first)
    doc["spec"]["target"]["rollout"] = {"minReadySeconds": min_ready_seconds}
    return doc


def statefulset(cluster: Cluster, namespace: str, name: str, pool: str) -> dict[str, Any]:
    return dict(cluster.get("statefulsets", f"{name}-target-{pool}", namespace))


def partition(sts: dict[str, Any]) -> int:
    return int(sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"])


def template_model(sts: dict[str, Any]) -> str:
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    return str(command[command.index("--model") + 1])


def pods(cluster: Cluster, namespace: str, name: str, pool: str) -> dict[str, dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name},starsd.io/pool={pool}"
    return {p["metadata"]["name"]: p for p in cluster.get("pods", namespace=namespace, selector=selector)}


def pod_model(pod: dict[str, Any]) -> str:
    command = pod["spec"]["containers"][0]["command"]
    return str(command[command.index("--model") + 1])


def settled_on(cluster: Cluster, namespace: str, name: str, model: str) -> dict[str, Any] | None:
    """The cluster once every target pod runs ``model``, every partition is 0 and the rollout is complete."""
    obj = ssd.get(cluster, namespace, name)
    cond = condition(obj, "RolloutProgressing") or {}
    every = [p for pool in ("h100", "l4") for p in pods(cluster, namespace, name, pool).values()]
    ok = (
        cond.get("reason") == "RolloutComplete"
        and len(every) == 3
        and all(pod_model(p) == model and not p["metadata"].get("deletionTimestamp") for p in every)
        and all(partition(statefulset(cluster, namespace, name, pool)) == 0 for pool in ("h100", "l4"))
    )
    return obj if ok else None


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    selector = f"involvedObject.kind=StarSDCluster,involvedObject.name={name}"
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", selector, "-o", "json").stdout
    return [(e["type"], e["reason"], e["message"]) for e in json.loads(out)["items"]]


def test_a_model_change_rolls_the_first_pool_while_the_second_is_held(cluster: Cluster, namespace: str) -> None:
    # Each updated h100 pod stays ready 15 s before the next is replaced: the h100-rolling, l4-held state lasts
    # at least 30 s, long enough for a probe of four reads on a busy machine to see it whole.
    doc = cluster_doc("roll", min_ready_seconds=15)
    ssd.apply(cluster, namespace, doc)
    ssd.wait_ready(cluster, namespace, "roll", replicas=3)

    doc["spec"]["target"]["model"]["path"] = V2
    ssd.apply(cluster, namespace, doc)

    # While h100 rolls (its StatefulSet on the new template, a partition below its replicas), l4 has the new
    # template too but a partition at its replicas, and its pod still runs the old model.
    seen: list[dict[str, Any]] = []

    def h100_rolling_l4_held() -> bool:
        l4_pods = pods(cluster, namespace, "roll", "l4")
        l4 = statefulset(cluster, namespace, "roll", "l4")
        h100 = statefulset(cluster, namespace, "roll", "h100")
        status = {
            p["name"]: p.get("rollout", {}) for p in ssd.get(cluster, namespace, "roll")["status"]["targets"]["pools"]
        }
        snapshot = {
            "h100": (template_model(h100), partition(h100), h100["status"].get("currentRevision"),
                     h100["status"].get("updateRevision"), status["h100"].get("state")),
            "l4": (template_model(l4), partition(l4), sorted(pod_model(p) for p in l4_pods.values()),
                   status["l4"].get("state")),
        }  # fmt: skip
        if not seen or seen[-1] != snapshot:
            seen.append(snapshot)  # each distinct state, for the failure message
        return (
            template_model(h100) == V2
            and partition(h100) < 2
            and h100["status"].get("currentRevision") != h100["status"].get("updateRevision")
            and template_model(l4) == V2
            and partition(l4) == 1
            and all(pod_model(p) != V2 for p in l4_pods.values())
            and status["l4"].get("state") == "Held"
            and status["h100"].get("state") == "Rolling"
        )

    try:
        wait_until("h100 rolling with l4 held", h100_rolling_l4_held, timeout=120)
    except AssertionError as exc:
        states = "\n".join(f"  {s}" for s in seen[-12:])
        raise AssertionError(f"{exc}; the states seen (model, partition, revisions, rollout state):\n{states}") from exc

    # No l4 pod runs the new model before h100 has settled: read l4's pods first, then h100's revisions.
    def check_order() -> dict[str, Any] | None:
        l4_new = any(pod_model(p) == V2 for p in pods(cluster, namespace, "roll", "l4").values())
        h100 = statefulset(cluster, namespace, "roll", "h100")["status"]
        assert not l4_new or h100.get("currentRevision") == h100.get("updateRevision"), "l4 rolled before h100 settled"
        return settled_on(cluster, namespace, "roll", V2)

    wait_until("every pod on the new model, the rollout complete", check_order, timeout=150)
    reasons = [reason for _, reason, _ in events(cluster, namespace, "roll")]
    assert {"PoolRolling", "PoolRolloutHeld", "PoolRolledOut"} <= set(reasons), reasons


def crash_loop(cluster: Cluster, namespace: str, pod: str) -> None:
    """Report ``pod`` as a kubelet reports a container that keeps exiting."""
    status = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
            ],
            "containerStatuses": [
                {
                    "name": "target",
                    "image": "starsd/target:dev",
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": f"no config.json in {V2}",
                        }
                    },
                }
            ],
        }
    }
    cluster.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )


def test_a_crash_looping_new_pod_halts_the_rollout_and_a_fix_resumes_it(cluster: Cluster, namespace: str) -> None:
    doc = cluster_doc("halt", min_ready_seconds=60)  # the new pod must stay ready a minute before the next goes
    ssd.apply(cluster, namespace, doc)
    ssd.wait_ready(cluster, namespace, "halt", replicas=3)

    doc["spec"]["target"]["model"]["path"] = V2
    ssd.apply(cluster, namespace, doc)

    def first_new_pod() -> str | None:
        found = [
            name
            for name, p in pods(cluster, namespace, "halt", "h100").items()
            if pod_model(p) == V2 and (condition(p, "Ready") or {}).get("status") == "True"
        ]
        return found[0] if found else None

    failing = wait_until("h100's first pod on the new model", first_new_pod, timeout=60)
    assert failing == "halt-target-h100-1"  # the top ordinal goes first
    crash_loop(cluster, namespace, failing)

    def halted() -> dict[str, Any] | None:
        obj = ssd.get(cluster, namespace, "halt")
        cond = condition(obj, "RolloutProgressing") or {}
        return obj if cond.get("status") == "False" and cond.get("reason") == "PoolRolloutHalted" else None

    obj = wait_until("RolloutProgressing=False, PoolRolloutHalted", halted, timeout=60)
    message = condition(obj, "RolloutProgressing")["message"]  # type: ignore[index]
    h100 = statefulset(cluster, namespace, "halt", "h100")
    for words in (
        "pool h100",
        h100["status"]["updateRevision"],
        failing,
        "ContainerFailing",
        f"no config.json in {V2}",
    ):
        assert words in message, message
    rows = {p["name"]: p["rollout"] for p in obj["status"]["targets"]["pools"]}
    assert rows["h100"]["state"] == "Halted" and rows["l4"]["state"] == "Held", rows
    # Halted: no further h100 pod is replaced (its partition back at its replicas), and l4 stays held.
    wait_until(
        "h100's partition raised to its replicas",
        lambda: partition(statefulset(cluster, namespace, "halt", "h100")) == 2,
    )
    assert partition(statefulset(cluster, namespace, "halt", "l4")) == 1
    assert pod_model(pods(cluster, namespace, "halt", "h100")["halt-target-h100-0"]) != V2
    assert all(pod_model(p) != V2 for p in pods(cluster, namespace, "halt", "l4").values())
    warnings = [(r, m) for t, r, m in events(cluster, namespace, "halt") if t == "Warning"]
    assert any(r == "PoolRolloutHalted" and failing in m for r, m in warnings), warnings

    # The fix: a model that works. h100 rolls again from the top (the crash-looping pod is replaced), then l4.
    doc["spec"]["target"]["model"]["path"] = V3
    doc["spec"]["target"]["rollout"] = {"minReadySeconds": 0}
    ssd.apply(cluster, namespace, doc)
    wait_until(
        "every pod on the fixed model, the rollout complete",
        lambda: settled_on(cluster, namespace, "halt", V3),
        timeout=150,
    )
    ssd.wait_ready(cluster, namespace, "halt", replicas=3)
