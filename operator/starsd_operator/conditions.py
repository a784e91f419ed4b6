"""``status.conditions`` in the ``metav1.Condition`` shape.

A condition's ``lastTransitionTime`` moves only when its ``status`` changes, so rewriting the same
condition every tick neither churns the object nor loses when the state began.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MESSAGE_LIMIT = 1024


@dataclass(frozen=True)
class Condition:
    type: str
    ok: bool
    reason: str  # CamelCase, as metav1.Condition requires
    message: str = ""
    unknown: bool = False  # status "Unknown": the operator cannot tell (``ok`` is then ignored)

    @property
    def status(self) -> str:
        return "Unknown" if self.unknown else "True" if self.ok else "False"


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with seconds, as the API server writes times."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def render(
    wanted: Sequence[Condition],
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The conditions list: ``wanted`` in order, keeping each unchanged status's transition time, followed
    by any previous condition of another type (written by something else) untouched."""
    out: list[dict[str, Any]] = []
    for cond in wanted:
        status = cond.status
        before = find(previous, cond.type)
        since = (
            str(before["lastTransitionTime"])
            if before and before.get("status") == status and before.get("lastTransitionTime")
            else timestamp(now)
        )
        rendered: dict[str, Any] = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": _truncate(cond.message),
            "lastTransitionTime": since,
        }
        if generation is not None:
            rendered["observedGeneration"] = generation
        out.append(rendered)
    types = {cond.type for cond in wanted}
    out.extend(dict(cond) for cond in previous or () if cond.get("type") not in types)
    return out


def _truncate(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."
