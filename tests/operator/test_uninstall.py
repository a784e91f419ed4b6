"""The operator's warning at start about clusters stuck in deletion behind its finalizer."""

from __future__ import annotations

from starsd_operator import constants as c
from starsd_operator import uninstall

from . import factories as f


def test_only_clusters_in_deletion_with_the_finalizer_are_stuck() -> None:
    live = f.body()
    stuck = f.body()
    stuck["metadata"].update(deletionTimestamp="2026-03-01T12:00:00Z", finalizers=[c.FINALIZER])
    going = f.body()
    going["metadata"].update(deletionTimestamp="2026-03-01T12:00:00Z", finalizers=["someone.else/finalizer"])
    [message] = uninstall.stuck([live, stuck, going])
    assert "StarSDCluster ml/chat has waited for deletion since 2026-03-01T12:00:00Z" in message
    assert c.FINALIZER in message
    assert "delete the StarSDClusters, then the chart, then the CRD" in message
