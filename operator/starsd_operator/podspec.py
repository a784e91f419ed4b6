"""Pieces shared by the draft's and the targets' pods: images, model volumes, probes, security, scheduling."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import constants as c
from . import lifecycle, modelsource
from .modelsource import ModelSource
from .spec import Placement

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


def probes(port: str, lc: lifecycle.Lifecycle | None = None) -> dict[str, Any]:
    """Readiness on ``/readyz`` (model loaded, serving), liveness on ``/healthz`` (the process is alive), and
    a startup probe that holds liveness off while the model loads (see :mod:`.lifecycle`)."""
    return lifecycle.probes(port, lc or lifecycle.Lifecycle())


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
    lc: lifecycle.Lifecycle | None = None,
    drain: bool = False,
) -> dict[str, Any]:
    """One data-plane container. A missing model ends the process with a message in
    ``/dev/termination-log``; ``FallbackToLogsOnError`` keeps the log's tail when it could not write one.
    With ``drain`` the container's preStop hook drains it (a target); a GPU container gets ``/dev/shm``."""
    _, shm_mounts = lifecycle.shm(resources)
    out = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "ports": ports,
        "env": [*common_env(), *(extra_env or [])],
        "resources": {k: dict(v) for k, v in resources.items()},
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": TMP_PATH}, *modelsource.mounts(model), *shm_mounts],
        "securityContext": container_security_context(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **probes(probe_port, lc),
    }
    if drain:
        out["lifecycle"] = lifecycle.drain_hook(int(ports[0]["containerPort"]))
    return out


def pod_spec(
    *,
    container_spec: dict[str, Any],
    model: ModelSource,
    placement: Placement,
    lc: lifecycle.Lifecycle | None = None,
) -> dict[str, Any]:
    """A pod spec around one container, with the placement's node selector and tolerations, and the model's
    volumes and downloader (:mod:`.modelsource`)."""
    spec: dict[str, Any] = {
        "containers": [container_spec],
        "volumes": [
            {"name": TMP_VOLUME, "emptyDir": {}},
            *modelsource.volumes(model),
            *lifecycle.shm(container_spec.get("resources") or {})[0],
        ],
        "securityContext": pod_security_context(),
        # The data plane never calls the API server, and needs no Service environment variables.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": (lc or lifecycle.Lifecycle()).grace_seconds,
    }
    fetch = modelsource.fetch_container(model, image=container_spec["image"], base=container_spec)
    if fetch is not None:
        spec["initContainers"] = [fetch]
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        spec["tolerations"] = [dict(t) for t in placement.tolerations]
    return spec
