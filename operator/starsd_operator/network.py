"""The NetworkPolicies: only this cluster's targets reach the draft's gRPC port, and only the clients of
``spec.network.clients`` (by default: pods of the cluster's own namespace) reach the targets' HTTP port.

A NetworkPolicy is enforced by the cluster's network plugin; with a plugin that does not implement them (the
simplest setups: kubenet, flannel alone) it is stored and does nothing (docs/models-and-pods.md says how to check).
"""

from __future__ import annotations

from typing import Any

from . import constants as c
from . import naming
from .naming import Owner
from .spec import NetworkSpec


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


def target_policy(owner: Owner, net: NetworkSpec) -> dict[str, Any]:
    """Ingress to every target pod (all pools), on the HTTP port only (the OpenAI API, ``/metrics``, the
    probes), from the clients ``spec.network.clients`` lists, each a NetworkPolicy peer as given; without
    them, from every pod of the cluster's own namespace. Anything else reaching the targets is dropped, a
    Prometheus in another namespace included unless it is listed. The kubelet's probes come from the node, which
    network plugins let through."""
    clients = [dict(peer) for peer in net.clients] if net.clients is not None else [{"podSelector": {}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": naming.metadata(owner, naming.target_policy_name(owner), c.COMPONENT_TARGET),
        "spec": {
            "podSelector": {"matchLabels": naming.selector_labels(owner, c.COMPONENT_TARGET)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": clients, "ports": [{"protocol": "TCP", "port": c.TARGET_HTTP_PORT}]}],
        },
    }
