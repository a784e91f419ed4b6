"""The drafts: a Deployment of ``spec.draft.replicas`` pods, a headless Service that lists the ready ones, and the
ClusterIP Service over any ready draft (kept for clients of the one-draft address).

Targets find the drafts live through the headless Service (``--drafts-from dns:NAME-draft-pods.NS.svc:50051``)
and pick theirs by rendezvous hashing (docs/architecture.md, "Several drafts"): no target needs a draft's name,
so the drafts are a Deployment, which surges a new draft in before the old one leaves and replaces a draft on a
lost node by itself. Clusters made by an operator of the StatefulSet days have a draft StatefulSet of the same
name: :func:`legacy_statefulset` names it, and the reconcile deletes it once the Deployment is ready.
"""

from __future__ import annotations

from typing import Any

from starsd import defaults

from . import constants as c
from . import naming, podspec, podtemplate
from .naming import Owner
from .spec import ClusterSpec


def deployment(owner: Owner, spec: ClusterSpec, images: podspec.Images) -> dict[str, Any]:
    """``spec.draft.replicas`` draft pods, listed (when ready) by :func:`headless_service`."""
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
        "kind": "Deployment",
        "metadata": naming.metadata(owner, naming.draft_name(owner), c.COMPONENT_DRAFT),
        "spec": {
            "replicas": draft.replicas,
            # A change starts one new draft and retires an old one only once the new one is ready: the star
            # never has fewer ready drafts than asked for (the surge pod needs room of its own: a spare GPU,
            # when the draft asks for one). The retired draft's targets move to their next choice.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
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


def legacy_statefulset(owner: Owner) -> str:
    """The name of the draft StatefulSet an operator of the StatefulSet days made (see :mod:`.controller`)."""
    return naming.draft_statefulset_name(owner)


def service(owner: Owner) -> dict[str, Any]:
    """gRPC and metrics (``/v1/load``, ``/metrics``) of any ready draft pod, under the one-draft address."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.metadata(owner, naming.draft_name(owner), c.COMPONENT_DRAFT),
        "spec": {"type": "ClusterIP", **_selector_and_ports(owner)},
    }


def headless_service(owner: Owner) -> dict[str, Any]:
    """What targets find their drafts by: its DNS name resolves to every ready draft pod's address (a draft that
    is not ready, or is leaving, has none, so its targets move to their next choice). Prometheus scrapes the
    drafts through it (``LABEL_SCRAPE``), not through :func:`service`, so each draft pod once."""
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
