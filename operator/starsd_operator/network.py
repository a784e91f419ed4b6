"""The draft's NetworkPolicy: only this cluster's targets reach its gRPC port."""

from __future__ import annotations

from typing import Any

from . import constants as c
from . import naming
from .naming import Owner


def draft_policy(owner: Owner) -> dict[str, Any]:
    """Ingress to the draft: gRPC from this cluster's target pods only; the metrics port (``/v1/load``,
    ``/metrics``, probes) from anywhere, since the operator and Prometheus may run in other namespaces."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": naming.metadata(owner, naming.draft_name(owner), c.COMPONENT_DRAFT),
        "spec": {
            "podSelector": {"matchLabels": naming.selector_labels(owner, c.COMPONENT_DRAFT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": naming.selector_labels(owner, c.COMPONENT_TARGET)}}],
                    "ports": [{"protocol": "TCP", "port": c.DRAFT_GRPC_PORT}],
                },
                {"ports": [{"protocol": "TCP", "port": c.DRAFT_METRICS_PORT}]},
            ],
        },
    }
