"""How a data-plane pod starts, is checked, and stops: probes, the grace period, the preStop drain, /dev/shm.

* A **startup probe** holds the liveness probe off for ``probes.startupSeconds`` while the model loads
  (a large checkpoint takes tens of minutes: the budget goes up to a day); then **readiness** on ``/readyz``
  and **liveness** on ``/healthz`` at their periods.
* ``terminationGracePeriodSeconds`` (default 120) bounds a stop. A target's **preStop** hook calls its
  ``/drain`` (:mod:`starsd.openai_api.drain`): readiness fails, new completions are refused, the ones in flight
  finish; the kubelet sends SIGTERM when it returns, and kills the pod at the end of the grace period.
* A pod that asks for a GPU gets a memory-backed ``/dev/shm`` (the runtime's 64 MiB default is too small for
  the CUDA libraries' inter-process buffers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starsd import defaults as d  # the CRD declares the same defaults and ranges (tests/test_defaults.py)

from .errors import SpecError

STARTUP_PERIOD = 10  # seconds between startup checks; the budget sets how many may fail
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"


class LifecycleError(SpecError):
    """A lifecycle field the operator cannot use; the message names it."""


@dataclass(frozen=True)
class Lifecycle:
    grace_seconds: int = d.GRACE_SECONDS
    startup_seconds: int = d.STARTUP_SECONDS
    readiness_period: int = d.READINESS_PERIOD_SECONDS
    liveness_period: int = d.LIVENESS_PERIOD_SECONDS
    probe_timeout: int = d.PROBE_TIMEOUT_SECONDS


def parse(raw: Mapping[str, Any], where: str) -> Lifecycle:
    """``terminationGracePeriodSeconds`` and ``probes`` of ``raw`` (a spec's ``draft`` or ``target``)."""
    probes = raw.get("probes")
    probes = {} if probes is None else probes
    if not isinstance(probes, Mapping):
        raise LifecycleError(f"{where}.probes must be an object")
    at = f"{where}.probes"
    return Lifecycle(
        grace_seconds=_int(raw, "terminationGracePeriodSeconds", where, d.GRACE_SECONDS, 0, d.GRACE_SECONDS_MAX),
        startup_seconds=_int(
            probes, "startupSeconds", at, d.STARTUP_SECONDS, d.STARTUP_SECONDS_MIN, d.STARTUP_SECONDS_MAX
        ),
        readiness_period=_int(
            probes, "readinessPeriodSeconds", at, d.READINESS_PERIOD_SECONDS, 1, d.PROBE_PERIOD_SECONDS_MAX
        ),
        liveness_period=_int(
            probes, "livenessPeriodSeconds", at, d.LIVENESS_PERIOD_SECONDS, 1, d.PROBE_PERIOD_SECONDS_MAX
        ),
        probe_timeout=_int(probes, "timeoutSeconds", at, d.PROBE_TIMEOUT_SECONDS, 1, d.PROBE_TIMEOUT_SECONDS_MAX),
    )


def _int(raw: Mapping[str, Any], key: str, where: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise LifecycleError(f"{where}.{key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def probes(port: str, lc: Lifecycle, ready: str = "/readyz", live: str = "/healthz") -> dict[str, Any]:
    """Startup (the load budget) and liveness on ``live``, readiness on ``ready`` (a vLLM pool has one path
    for both, :mod:`.vllmpool`)."""

    def get(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": port},
            "periodSeconds": period,
            "timeoutSeconds": lc.probe_timeout,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": get(live, STARTUP_PERIOD, math.ceil(lc.startup_seconds / STARTUP_PERIOD)),
        "readinessProbe": get(ready, lc.readiness_period, 3),
        "livenessProbe": get(live, lc.liveness_period, 3),
    }


def drain_hook(port: int) -> dict[str, Any]:
    """The target's preStop hook: ``GET /drain`` on the pod's loopback (the only address the target accepts
    a drain from), answered once the completions in flight have finished. The image's Python does the GET:
    no curl or wget needed."""
    script = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/drain')"
    return {"preStop": {"exec": {"command": ["python", "-c", script]}}}


def wants_gpu(resources: Mapping[str, Any]) -> bool:
    """Whether a container's resources ask for a GPU (``nvidia.com/gpu``, ``amd.com/gpu``, ...)."""
    return any(
        str(name).endswith("/gpu") and str(amount) not in ("0", "")
        for kind in ("limits", "requests")
        for name, amount in (resources.get(kind) or {}).items()
    )


def shm(
    resources: Mapping[str, Any], size_limit: str = d.SHM_SIZE_LIMIT
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(volumes, mounts)`` of a memory-backed ``/dev/shm`` of at most ``size_limit`` for a GPU container;
    nothing for a CPU one."""
    if not wants_gpu(resources):
        return [], []
    volume = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size_limit}}
    return [volume], [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
