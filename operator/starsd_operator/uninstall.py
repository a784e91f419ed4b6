"""What keeps a StarSDCluster from going away: its finalizer, which only a running operator removes.

kopf puts ``starsd.io/finalizer`` on every cluster (its timers need one). A cluster deleted while no
operator runs stays, with a ``deletionTimestamp``, until one does; so the uninstall order is: delete the
StarSDClusters, then the chart, then the CRD (charts/starsd/README.md). :func:`stuck` names the clusters an
operator finds in that state at start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import constants as c


def stuck(clusters: Iterable[Mapping[str, Any]]) -> list[str]:
    """One warning per cluster that waits for deletion behind the operator's finalizer."""
    out = []
    for body in clusters:
        meta = body.get("metadata") or {}
        if not meta.get("deletionTimestamp") or c.FINALIZER not in (meta.get("finalizers") or []):
            continue
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        out.append(
            f"StarSDCluster {where} has waited for deletion since {meta['deletionTimestamp']}: its finalizer"
            f" {c.FINALIZER} is removed by a running operator (this one will now). Uninstall in this order:"
            " delete the StarSDClusters, then the chart, then the CRD"
        )
    return out
