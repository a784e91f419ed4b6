"""PodDisruptionBudgets: a node drain or a cluster upgrade evicts at most ``maxUnavailable`` pods of the draft
and of each pool at a time (default 1), so a voluntary disruption never takes a whole pool, or the draft and
its replacement at once. A pool with no replicas has none (a budget over no pods would only confuse
``kubectl drain``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starsd import defaults

from . import constants as c
from . import naming
from .errors import SpecError
from .naming import Owner

_PERCENT = re.compile(r"^(100|[1-9]?[0-9])%$")


class DisruptionError(SpecError):
    """A ``disruption`` field the operator cannot use; the message names it."""


@dataclass(frozen=True)
class Disruption:
    max_unavailable: int | str = defaults.MAX_UNAVAILABLE  # a count, or a percentage such as "25%"


def parse(parent: Mapping[str, Any], where: str) -> Disruption:
    raw = parent.get("disruption")
    if raw is None:
        return Disruption()
    if not isinstance(raw, Mapping):
        raise DisruptionError(f"{where}.disruption must be an object")
    value = raw.get("maxUnavailable", defaults.MAX_UNAVAILABLE)
    ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 1) or (
        isinstance(value, str) and _PERCENT.match(value) is not None and value != "0%"
    )
    if not ok:
        raise DisruptionError(
            f"{where}.disruption.maxUnavailable must be a count >= 1 or a percentage like '25%', got {value!r}"
        )
    return Disruption(max_unavailable=value)


def budget(owner: Owner, name: str, component: str, disruption: Disruption, pool: str | None = None) -> dict[str, Any]:
    """The budget over one workload's pods (its selector's labels)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": naming.metadata(owner, name, component, pool),
        "spec": {
            "maxUnavailable": disruption.max_unavailable,
            "selector": {"matchLabels": naming.selector_labels(owner, component, pool)},
            # A pod that never became ready (a failed model download, say) may be evicted anyway.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def draft_budget(owner: Owner, disruption: Disruption) -> dict[str, Any]:
    return budget(owner, naming.draft_name(owner), c.COMPONENT_DRAFT, disruption)


def pool_budget(owner: Owner, pool: str, disruption: Disruption) -> dict[str, Any]:
    return budget(owner, naming.pool_name(owner, pool), c.COMPONENT_TARGET, disruption, pool)
