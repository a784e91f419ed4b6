"""When a status change is worth a write: the status is written on a real change only.

A real change is a condition's status or reason (the rebalancer's holding reasons count as one), a count,
the regime, a readiness, the last rebalance, or the draft's utilisation moving by more than
:data:`UTILIZATION_STEP`. Everything else that moves every tick (the utilisation's small jitter, queue and
demand figures, N*, the wording of a message, which holding reason) is refreshed at most once per
:data:`REFRESH_SECONDS`, so an idle cluster, or one whose load hovers at a threshold, costs the API server
about one PATCH a minute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UTILIZATION_STEP = 0.05
REFRESH_SECONDS = 60.0
# Figures that move with every reading: refreshed, never a reason to write on their own.
VOLATILE_DRAFT = frozenset(
    {"utilization", "queueDepth", "activeSessions", "runningRequests", "waitingRequests", "targetOccupancy"}
)
VOLATILE_TOP = frozenset({"recommendedTargets"})
# In status.drafts: the busiest draft's utilisation (compared like the draft's, by UTILIZATION_STEP) and each
# draft's figures; a draft's regime, or its reading failing, is a real change.
VOLATILE_DRAFTS = frozenset({"worstUtilization", "loads"})


# The Rebalancing condition's reasons while the count holds: a load near a threshold flips between them from
# one reading to the next (Balanced, then Stabilizing as a recommendation enters the window, ...). Which one
# holds is refreshed like a figure; the count moving, or the rebalancer stopping, is a real change.
HOLDING = frozenset({"Balanced", "Stabilizing", "RateLimited", "AtBound"})


def _reason(condition: Mapping[str, Any]) -> str:
    reason = str(condition.get("reason"))
    return "Holding" if condition.get("type") == "Rebalancing" and reason in HOLDING else reason


def essence(status: Mapping[str, Any]) -> dict[str, Any]:
    """What a real change changes: ``status`` without its volatile figures and condition wording."""
    out = {k: v for k, v in status.items() if k not in VOLATILE_TOP and k not in ("conditions", "draft", "drafts")}
    out["conditions"] = sorted(
        (str(c.get("type")), str(c.get("status")), _reason(c)) for c in status.get("conditions") or []
    )
    draft = status.get("draft") or {}
    out["draft"] = {k: v for k, v in draft.items() if k not in VOLATILE_DRAFT}
    drafts = status.get("drafts") or {}
    out["drafts"] = {k: v for k, v in drafts.items() if k not in VOLATILE_DRAFTS}
    out["draftLoads"] = [(row.get("index"), row.get("regime"), "error" in row) for row in drafts.get("loads") or []]
    return out


def _moved(before: Any, after: Any) -> bool:
    """A utilisation appearing, disappearing or moving by more than :data:`UTILIZATION_STEP`."""
    if (before is None) != (after is None):
        return True
    return before is not None and after is not None and abs(float(after) - float(before)) > UTILIZATION_STEP


def significant(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``new`` differs from the stored ``old`` by a real change."""
    if essence(old) != essence(new):
        return True
    return any(
        _moved((old.get(part) or {}).get(key), (new.get(part) or {}).get(key))
        for part, key in (("draft", "utilization"), ("drafts", "worstUtilization"))
    )


def should_write(old: Mapping[str, Any], new: Mapping[str, Any], last_write: float | None, now: float) -> bool:
    """Write ``new`` now? On a real change; else a refresh once :data:`REFRESH_SECONDS` have passed since the
    last write (``None``: none since the operator started)."""
    if significant(old, new):
        return True
    return last_write is None or now - last_write >= REFRESH_SECONDS
