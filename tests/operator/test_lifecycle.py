"""Probes, grace period, the preStop drain and /dev/shm in the pods the operator builds."""

from __future__ import annotations

from typing import Any

import pytest
from starsd_operator import draft, lifecycle, targets
from starsd_operator.podspec import Images
from starsd_operator.spec import SpecError, parse

from . import factories as f

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")


def target_pod(target: dict[str, Any] | None = None, **pool: Any) -> dict[str, Any]:
    spec = parse(f.spec(target={"model": {"path": "/t"}, **(target or {})}, pools=[{"name": "a", **pool}]))
    pod: dict[str, Any] = targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)["spec"]["template"]["spec"]
    return pod


def draft_pod(**draft_fields: Any) -> dict[str, Any]:
    spec = parse(f.spec(draft={"model": {"path": "/d"}, **draft_fields}))
    pod: dict[str, Any] = draft.deployment(f.OWNER, spec, IMAGES)["spec"]["template"]["spec"]
    return pod


def test_defaults_a_ten_minute_load_budget_and_a_two_minute_grace_period() -> None:
    pod = target_pod()
    [server] = pod["containers"]
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 600
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pod["terminationGracePeriodSeconds"] == 120 == draft_pod()["terminationGracePeriodSeconds"]


def test_a_large_model_gets_hours_to_load() -> None:
    probes = {"startupSeconds": 4 * 3600, "readinessPeriodSeconds": 2, "livenessPeriodSeconds": 30, "timeoutSeconds": 5}
    pod = target_pod({"probes": probes, "terminationGracePeriodSeconds": 900})
    [server] = pod["containers"]
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 4 * 3600
    assert server["readinessProbe"]["periodSeconds"] == 2 and server["livenessProbe"]["periodSeconds"] == 30
    assert {p["timeoutSeconds"] for p in (startup, server["readinessProbe"], server["livenessProbe"])} == {5}
    assert pod["terminationGracePeriodSeconds"] == 900
    # The draft keeps its own settings.
    assert draft_pod()["containers"][0]["startupProbe"]["failureThreshold"] == 60


def test_a_budget_that_is_not_a_multiple_of_the_period_is_rounded_up() -> None:
    [server] = target_pod({"probes": {"startupSeconds": 95}})["containers"]
    assert server["startupProbe"]["failureThreshold"] == 10


def test_targets_drain_before_they_stop_and_the_draft_does_not() -> None:
    [server] = target_pod()["containers"]
    [command] = [server["lifecycle"]["preStop"]["exec"]["command"]]
    assert command[:2] == ["python", "-c"] and "http://127.0.0.1:8000/drain" in command[2]
    compile(command[2], "preStop", "exec")  # the hook's script is valid Python
    assert "lifecycle" not in draft_pod()["containers"][0]


def test_gpu_pods_get_a_memory_backed_dev_shm_and_cpu_pods_do_not() -> None:
    gpu = target_pod(resources={"limits": {"nvidia.com/gpu": "1"}})
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in gpu["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in gpu["containers"][0]["volumeMounts"]
    draft_gpu = draft_pod(resources={"limits": {"amd.com/gpu": 1}})
    assert any(m["mountPath"] == "/dev/shm" for m in draft_gpu["containers"][0]["volumeMounts"])
    cpu = target_pod(resources={"limits": {"cpu": "4"}})
    assert not any(v["name"] == "dshm" for v in cpu["volumes"])
    assert not lifecycle.wants_gpu({"limits": {"nvidia.com/gpu": "0"}})


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"terminationGracePeriodSeconds": -1}, "spec.target.terminationGracePeriodSeconds"),
        ({"probes": {"startupSeconds": 5}}, "spec.target.probes.startupSeconds"),
        ({"probes": {"timeoutSeconds": "2"}}, "spec.target.probes.timeoutSeconds"),
        ({"probes": []}, "spec.target.probes"),
    ],
)
def test_bad_lifecycle_fields_are_named(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse(f.spec(target={"model": {"path": "/t"}, **fields}))
