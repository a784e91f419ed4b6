"""Pieces shared by the draft's and the targets' pods: images, model volumes, probes, security, scheduling."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import constants as c
from . import modelsource
from .spec import ModelSource, Placement

TMP_VOLUME = "tmp"
TMP_PATH = "/tmp"


@dataclass(frozen=True)
class Images:
    """Default images of the two components (a spec's ``image`` overrides them)."""

    draft: str = c.DEFAULT_DRAFT_IMAGE
    target: str = c.DEFAULT_TARGET_IMAGE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Images:
        return cls(
            draft=env.get(c.ENV_DRAFT_IMAGE) or c.DEFAULT_DRAFT_IMAGE,
            target=env.get(c.ENV_TARGET_IMAGE) or c.DEFAULT_TARGET_IMAGE,
        )


def probes(port: str) -> dict[str, Any]:
    """Readiness on ``/readyz`` (model loaded, serving), liveness on ``/healthz`` (the process is alive).

    The startup probe holds liveness off for up to ten minutes while a large model loads.
    """

    def get(path: str, period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": port},
            "periodSeconds": period,
            "timeoutSeconds": 2,
            "failureThreshold": failures,
        }

    return {
        "startupProbe": get("/healthz", 5, 120),
        "readinessProbe": get("/readyz", 5, 3),
        "livenessProbe": get("/healthz", 10, 3),
    }


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": c.RUN_AS_USER,
        "runAsGroup": c.RUN_AS_USER,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": c.RUN_AS_USER,
        "runAsGroup": c.RUN_AS_USER,
        "fsGroup": c.RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def common_env() -> list[dict[str, Any]]:
    """The pod's identity, and a writable home for caches under a read-only root filesystem."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": TMP_PATH},
        {"name": "HF_HOME", "value": f"{TMP_PATH}/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
    ]


def container(
    *,
    name: str,
    image: str,
    command: list[str],
    ports: list[dict[str, Any]],
    probe_port: str,
    model: ModelSource,
    resources: Mapping[str, Any],
    extra_env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One data-plane container. A missing model ends the process with a message in
    ``/dev/termination-log``; ``FallbackToLogsOnError`` keeps the log's tail when it could not write one."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "ports": ports,
        "env": [*common_env(), *(extra_env or [])],
        "resources": {k: dict(v) for k, v in resources.items()},
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": TMP_PATH}, *modelsource.mounts(model)],
        "securityContext": container_security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **probes(probe_port),
    }


def pod_spec(*, container_spec: dict[str, Any], model: ModelSource, placement: Placement) -> dict[str, Any]:
    """A pod spec around one container, with the placement's node selector and tolerations, and the model's
    volumes and downloader (:mod:`.modelsource`)."""
    spec: dict[str, Any] = {
        "containers": [container_spec],
        "volumes": [{"name": TMP_VOLUME, "emptyDir": {}}, *modelsource.volumes(model)],
        "securityContext": pod_security_context(),
        # The data plane never calls the API server, and needs no Service environment variables.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
    }
    fetch = modelsource.fetch_container(model, image=container_spec["image"], base=container_spec)
    if fetch is not None:
        spec["initContainers"] = [fetch]
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        spec["tolerations"] = [dict(t) for t in placement.tolerations]
    return spec
