"""Plain-dict custom resources and children for the operator's tests (what the API server would hold)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from starsd_operator import constants as c
from starsd_operator.naming import Owner

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "starsdcluster.yaml"
SAMPLE_PATH = REPO / "examples" / "starsd-cluster.yaml"

OWNER = Owner(name="chat", namespace="ml", uid="0b5d8a5e-uid")


def spec(**overrides: Any) -> dict[str, Any]:
    """A minimal valid spec (two pools) with top-level keys replaced by ``overrides``."""
    base: dict[str, Any] = {
        "draft": {"model": {"path": "/models/draft"}},
        "target": {"model": {"path": "/models/target"}, "gamma": 4},
        "targets": {"replicas": 3},
        "pools": [
            {"name": "h100", "weight": 2, "minReplicas": 0, "maxReplicas": 8},
            {"name": "l4", "weight": 1, "minReplicas": 0, "maxReplicas": 8},
        ],
    }
    base.update(copy.deepcopy(overrides))
    return base


def body(
    spec_: dict[str, Any] | None = None,
    *,
    generation: int = 1,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {
            "name": OWNER.name,
            "namespace": OWNER.namespace,
            "uid": OWNER.uid,
            "generation": generation,
            "annotations": dict(annotations or {}),
        },
        "spec": spec_ if spec_ is not None else spec(),
        "status": dict(status or {}),
    }


def workload(kind: str, name: str, replicas: int, *, ready: int | None = None, generation: int = 1) -> dict[str, Any]:
    """A Deployment or StatefulSet as the API server reports it once its controller has acted."""
    ready = replicas if ready is None else ready
    return {
        "kind": kind,
        "metadata": {"name": name, "namespace": OWNER.namespace, "generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas,
        },
    }


def pod(name: str, component: str, pool: str | None = None, **status: Any) -> dict[str, Any]:
    labels = {c.LABEL_INSTANCE: OWNER.name, c.LABEL_COMPONENT: component}
    if pool:
        labels[c.LABEL_POOL] = pool
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def sample() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SAMPLE_PATH.read_text())
    return loaded
