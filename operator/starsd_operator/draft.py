"""The draft's Deployment and Service: one draft serving every target of the cluster over gRPC."""

from __future__ import annotations

from typing import Any

from . import constants as c
from . import naming, podspec, podtemplate
from .naming import Owner
from .spec import ClusterSpec


def deployment(owner: Owner, spec: ClusterSpec, images: podspec.Images) -> dict[str, Any]:
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
            "auto",
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
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": naming.metadata(owner, naming.draft_name(owner), c.COMPONENT_DRAFT),
        "spec": {
            "replicas": 1,
            # One draft usually holds a whole GPU: a surge pod would wait for a second one, so the old pod
            # goes first. Targets fall back to decoding on their own while the new draft starts.
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": naming.selector_labels(owner, c.COMPONENT_DRAFT)},
            "template": podtemplate.merge(
                {
                    "metadata": {"labels": naming.labels(owner, c.COMPONENT_DRAFT)},
                    "spec": podspec.pod_spec(
                        container_spec=container, model=draft.model, placement=draft.placement, lc=draft.lifecycle
                    ),
                },
                draft.pod_template,
            ),
        },
    }


def service(owner: Owner) -> dict[str, Any]:
    """gRPC for the targets, metrics (``/v1/load``, ``/metrics``) for the operator and Prometheus."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.metadata(owner, naming.draft_name(owner), c.COMPONENT_DRAFT),
        "spec": {
            "type": "ClusterIP",
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
        },
    }
