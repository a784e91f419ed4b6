"""The drafts: a StatefulSet of ``spec.draft.replicas`` pods, a headless Service that names each pod, and the
ClusterIP Service over any ready draft (kept for clients of the one-draft address).

Every target lists all draft pods by their DNS names and connects to its own first (``starsd.assignment``,
docs/architecture.md); a draft pod needs a stable name, so a StatefulSet, not a Deployment. Clusters made by
an operator before several drafts have a draft Deployment of the same name: :func:`legacy_deployment` names
it, and the reconcile deletes it once the StatefulSet exists.
"""

from __future__ import annotations

from typing import Any

from starsd import defaults

from . import constants as c
from . import naming, podspec, podtemplate
from .naming import Owner
from .spec import ClusterSpec


def statefulset(owner: Owner, spec: ClusterSpec, images: podspec.Images) -> dict[str, Any]:
    """``spec.draft.replicas`` draft pods ``<name>-draft-0..D-1``, named in DNS by :func:`headless_service`."""
    draft = spec.draft
    container = podspec.container(
        name=c.COMPONENT_DRAFT,
        image=draft.image or images.draft,
        command=[
            "starsd",
            "draft",
            "--model",
            draft.model.serve_path,
            "--port",
            str(c.DRAFT_GRPC_PORT),
            "--metrics-port",
            str(c.DRAFT_METRICS_PORT),
            "--device",
            podspec.device_for(draft.placement.resources),
            "--dtype",
            draft.dtype,
            "--max-batch",
            str(draft.max_batch),
            "--schedule",
            draft.schedule,
        ],
        ports=[
            {"name": "grpc", "containerPort": c.DRAFT_GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": c.DRAFT_METRICS_PORT, "protocol": "TCP"},
        ],
        probe_port="metrics",
        model=draft.model,
        resources=draft.placement.resources,
        lc=draft.lifecycle,
        sizes=draft.size_limits,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": naming.metadata(owner, naming.draft_statefulset_name(owner), c.COMPONENT_DRAFT),
        "spec": {
            "replicas": draft.replicas,
            "serviceName": naming.draft_headless_name(owner),
            # Drafts are independent of each other: start and stop them all at once.
            "podManagementPolicy": "Parallel",
            # A change replaces one draft pod at a time, the old pod first (it usually holds a whole GPU, so a
            # surge pod would wait for a second one); its targets move to the other drafts meanwhile, or fall
            # back to decoding on their own when it is the only one.
            "updateStrategy": {"type": "RollingUpdate"},
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": naming.selector_labels(owner, c.COMPONENT_DRAFT)},
            "template": podspec.settle_serving(
                podtemplate.merge(
                    {
                        "metadata": {"labels": naming.labels(owner, c.COMPONENT_DRAFT)},
                        "spec": podspec.pod_spec(
                            container_spec=container,
                            model=draft.model,
                            placement=draft.placement,
                            lc=draft.lifecycle,
                            sizes=draft.size_limits,
                        ),
                    },
                    draft.pod_template,
                ),
                {"cpu": defaults.DRAFT_CPU_REQUEST, "memory": defaults.DRAFT_MEMORY_REQUEST},
            ),
        },
    }


def legacy_deployment(owner: Owner) -> str:
    """The name of the draft Deployment an operator before several drafts made (see :mod:`.controller`)."""
    return naming.draft_name(owner)


def service(owner: Owner) -> dict[str, Any]:
    """gRPC and metrics (``/v1/load``, ``/metrics``) of any ready draft pod, under the one-draft address."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.metadata(owner, naming.draft_name(owner), c.COMPONENT_DRAFT),
        "spec": {"type": "ClusterIP", **_selector_and_ports(owner)},
    }


def headless_service(owner: Owner) -> dict[str, Any]:
    """The StatefulSet's governing Service: ``<name>-draft-<i>.<this>.<namespace>.svc`` per ready draft pod
    (a draft that is not ready has no address, so its targets try the next one). Prometheus scrapes the drafts
    through it (``LABEL_SCRAPE``), not through :func:`service`, so each draft pod once."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.scraped(naming.metadata(owner, naming.draft_headless_name(owner), c.COMPONENT_DRAFT)),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, **_selector_and_ports(owner)},
    }


def _selector_and_ports(owner: Owner) -> dict[str, Any]:
    """gRPC for the targets, metrics for the operator and Prometheus."""
    return {
        "selector": naming.selector_labels(owner, c.COMPONENT_DRAFT),
        "ports": [
            {
                "name": "grpc",
                "port": c.DRAFT_GRPC_PORT,
                "targetPort": "grpc",
                "protocol": "TCP",
                "appProtocol": "grpc",
            },
            {
                "name": "metrics",
                "port": c.DRAFT_METRICS_PORT,
                "targetPort": "metrics",
                "protocol": "TCP",
                "appProtocol": "http",
            },
        ],
    }
