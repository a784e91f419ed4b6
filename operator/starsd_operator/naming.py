"""Names, labels, selectors and owner references of a cluster's children.

The CRD restricts a ``StarSDCluster``'s name to a DNS-1035 label (it names Services) and a pool's name to 24
characters; :func:`child_name` still shortens a too-long name with a stable hash suffix so any valid pair of
names yields valid children.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from . import constants as c

# A StatefulSet's pods carry ``controller-revision-hash: <name>-<10 chars>``, a label value (<= 63).
STATEFULSET_NAME_LIMIT = 52
NAME_LIMIT = 63


@dataclass(frozen=True)
class Owner:
    """The ``StarSDCluster`` that owns the children."""

    name: str
    namespace: str
    uid: str


def child_name(*parts: str, limit: int = NAME_LIMIT) -> str:
    """``parts`` joined by ``-``; when longer than ``limit``, cut and suffixed with a hash of the whole."""
    full = "-".join(parts)
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[: limit - 9].rstrip('-')}-{digest}"


def draft_name(owner: Owner) -> str:
    """The drafts' Deployment, Service, NetworkPolicy and PodDisruptionBudget."""
    return child_name(owner.name, c.COMPONENT_DRAFT)


def draft_statefulset_name(owner: Owner) -> str:
    """The draft StatefulSet of operators before the drafts were a Deployment again (the reconcile replaces it):
    :func:`draft_name` unless that was too long for a StatefulSet's pods' labels."""
    return child_name(owner.name, c.COMPONENT_DRAFT, limit=STATEFULSET_NAME_LIMIT)


def pool_name(owner: Owner, pool: str) -> str:
    """One pool's StatefulSet and its headless Service."""
    return child_name(owner.name, c.COMPONENT_TARGET, pool, limit=STATEFULSET_NAME_LIMIT)


def target_policy_name(owner: Owner) -> str:
    """The targets' NetworkPolicy (every pool's pods)."""
    return child_name(owner.name, c.COMPONENT_TARGET)


def client_service_name(owner: Owner) -> str:
    """The Service clients call: every ready target of every pool, under the cluster's own name."""
    return owner.name


def draft_endpoint(owner: Owner) -> str:
    """``host:port`` of the draft's gRPC Service as targets dial it."""
    return f"{draft_name(owner)}.{owner.namespace}.svc:{c.DRAFT_GRPC_PORT}"


def default_load_url(owner: Owner) -> str:
    return f"http://{draft_name(owner)}.{owner.namespace}.svc:{c.DRAFT_METRICS_PORT}{c.LOAD_PATH}"


def draft_headless_name(owner: Owner) -> str:
    """The headless Service whose DNS name resolves to every ready draft pod's address."""
    return child_name(owner.name, c.COMPONENT_DRAFT, "pods")


def drafts_source(owner: Owner) -> str:
    """What every target is given to find the drafts live (``--drafts-from``): the headless Service and the
    drafts' gRPC port. It names no draft and no count, so a new draft count changes no target's template."""
    return f"dns:{draft_headless_name(owner)}.{owner.namespace}.svc:{c.DRAFT_GRPC_PORT}"


def draft_pod_load_url(pod_ip: str) -> str:
    """``GET /v1/load`` of one draft pod, by its address (draft pods have no names of their own in DNS)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{c.DRAFT_METRICS_PORT}{c.LOAD_PATH}"


def selector_labels(owner: Owner, component: str, pool: str | None = None) -> dict[str, str]:
    """The immutable selector of a workload (and the selector of its Service)."""
    labels = {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: owner.name,
        c.LABEL_COMPONENT: component,
    }
    if pool is not None:
        labels[c.LABEL_POOL] = pool
    return labels


def labels(owner: Owner, component: str, pool: str | None = None) -> dict[str, str]:
    """Every label a child and its pods carry."""
    return {**selector_labels(owner, component, pool), c.LABEL_MANAGED_BY: c.MANAGED_BY}


def owned_selector(owner: Owner, component: str | None = None) -> str:
    """A label selector (string form) for every child of ``owner``, or those of one component."""
    parts = [f"{c.LABEL_INSTANCE}={owner.name}", f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"]
    if component is not None:
        parts.append(f"{c.LABEL_COMPONENT}={component}")
    return ",".join(parts)


def status_selector(owner: Owner) -> str:
    """``status.selector``: what the scale subresource reports, so an HPA finds the target pods."""
    return f"{c.LABEL_INSTANCE}={owner.name},{c.LABEL_COMPONENT}={c.COMPONENT_TARGET}"


def scraped(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` of the Service Prometheus scrapes a workload's pods through (see ``LABEL_SCRAPE``)."""
    metadata["labels"][c.LABEL_SCRAPE] = "true"
    return metadata


def owner_reference(owner: Owner) -> dict[str, Any]:
    """The controller reference that lets the garbage collector delete a child with its cluster."""
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(owner: Owner, name: str, component: str, pool: str | None = None) -> dict[str, Any]:
    """``metadata`` of a child: name, namespace, labels and the owner reference."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, component, pool),
        "ownerReferences": [owner_reference(owner)],
    }
