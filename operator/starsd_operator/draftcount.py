"""The number of drafts: the spec's counts, the ready drafts, and the status the draft decision records.

D drafts keep ``D * N*`` targets busy (docs/architecture.md section 2); :func:`rebalancer.decide_drafts` decides
the count, the controller patches ``spec.draft.replicas`` (bounded by ``spec.autoscaling.minDrafts`` /
``maxDrafts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from . import constants as c
from . import naming
from .loadclient import DraftReadings
from .naming import Owner
from .rebalancer import Change, Decision
from .spec import ClusterSpec
from .status import Children, rebalance_record, recorded_change


def replicas(spec: ClusterSpec) -> int:
    """``spec.draft.replicas``: the draft pods asked for."""
    return spec.draft.replicas


def bounds(spec: ClusterSpec) -> tuple[int, int]:
    """``(minDrafts, maxDrafts)`` of ``spec.autoscaling`` (1, 1 by default: the draft count never moves)."""
    return spec.autoscaling.min_drafts, max(spec.autoscaling.min_drafts, spec.autoscaling.max_drafts)


def ready(children: Children, owner: Owner) -> int:
    """Ready draft pods: the draft Deployment's ``readyReplicas``."""
    workload = children.named("Deployment", naming.draft_name(owner))
    return int(((workload or {}).get("status") or {}).get("readyReplicas") or 0)


def ready_pod_ips(children: Children) -> list[str]:
    """The addresses of the ready draft pods, by pod name (where the operator reads each draft's load)."""
    rows = []
    for pod in children.pods_of(c.COMPONENT_DRAFT):
        st = pod.get("status") or {}
        ready = any(x.get("type") == "Ready" and x.get("status") == "True" for x in st.get("conditions") or [])
        if ready and st.get("podIP") and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            rows.append((str((pod.get("metadata") or {}).get("name")), str(st["podIP"])))
    return [ip for _, ip in sorted(rows)]


def last_change(previous_status: Mapping[str, Any]) -> list[Change]:
    """The draft count's last change as ``status.drafts.lastRebalance`` holds it (rate limits after a restart)."""
    return recorded_change((previous_status.get("drafts") or {}).get("lastRebalance"))


def status(
    readings: DraftReadings | None,
    decision: Decision | None,
    previous_status: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any]:
    """``{"drafts": {...}}`` to merge into the status: the worst draft's utilisation, each draft's load (or why
    it could not be read), and the draft count's last change (kept from ``previous_status`` until a new one)."""
    drafts: dict[str, Any] = {}
    if readings is not None:
        loads = readings.readable
        drafts["worstUtilization"] = round(max(x.utilization for x in loads), 2) if loads else None
        rows: list[dict[str, Any]] = []
        for i, (load, error) in enumerate(zip(readings.loads, readings.errors, strict=True)):
            if load is None:
                rows.append({"index": i, "error": error})
                continue
            rows.append(
                {
                    "index": i,
                    "utilization": round(load.utilization, 2),
                    "regime": load.regime or None,
                    "queueDepth": round(load.queue_depth, 2),
                    "connectedTargets": load.targets,
                    "waitingRequests": load.waiting_requests,
                    "recommendedTargets": load.optimal_targets(),
                }
            )
        drafts["loads"] = rows
    last = (previous_status.get("drafts") or {}).get("lastRebalance")
    if decision is not None and decision.changed:
        last = rebalance_record(decision, now)
    if last:
        drafts["lastRebalance"] = last
    return {"drafts": drafts}
