"""Pieces shared by the draft's and the targets' pods: images, model volumes, probes, security, scheduling."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starsd import defaults

from . import constants as c
from . import lifecycle, modelsource
from .modelsource import ModelSource
from .spec import Placement, SizeLimits

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


def probes(port: str, lc: lifecycle.Lifecycle | None = None, health: str | None = None) -> dict[str, Any]:
    """Readiness on ``/readyz`` (model loaded, serving), liveness on ``/healthz`` (the process is alive), and
    a startup probe that holds liveness off while the model loads (see :mod:`.lifecycle`); with ``health``,
    that one path for all three (another engine's)."""
    lc = lc or lifecycle.Lifecycle()
    if health is not None:
        return lifecycle.probes(port, lc, ready=health, live=health)
    return lifecycle.probes(port, lc)


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
        # The node, named in the message of a process that cannot use the GPU it was told to (starsd.devices).
        {"name": defaults.NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "HOME", "value": TMP_PATH},
        {"name": "HF_HOME", "value": f"{TMP_PATH}/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
    ]


def device_for(resources: Mapping[str, Any]) -> str:
    """The serving process's ``--device``: ``cuda`` for a container that asks for a GPU, else ``cpu``. Never
    ``auto``: a GPU pod whose image cannot use the GPU stops with a reason instead of decoding on the CPU while
    holding the GPU, and a CPU pod never grabs a GPU it did not ask for."""
    return "cuda" if lifecycle.wants_gpu(resources) else "cpu"


def settle_serving(template: dict[str, Any], default_requests: Mapping[str, str]) -> dict[str, Any]:
    """``template`` (a merged pod template) with its serving container finished from its resources as merged
    (so what a ``podTemplate`` gives counts too): ``--device`` set by :func:`device_for`, and the role's
    ``default_requests`` (cpu, memory) added by :func:`with_default_requests`. A command without ``--device``
    (another engine's, which finds its device itself) is left as it is."""
    serving = template["spec"]["containers"][0]
    resources = with_default_requests(serving.get("resources") or {}, default_requests)
    serving["resources"] = resources
    command = serving["command"]
    if "--device" in command:
        command[command.index("--device") + 1] = device_for(resources)
    return template


def with_default_requests(resources: Mapping[str, Any], defaults_: Mapping[str, str]) -> dict[str, Any]:
    """``resources`` with a request from ``defaults_`` (cpu, memory) for each resource it names nowhere
    (neither in requests nor in limits, whose value Kubernetes copies into a missing request, so a default
    never exceeds a limit): the pod is Burstable at least, never BestEffort. What is given is kept as given."""
    out = {k: dict(v) for k, v in resources.items()}
    named = {name for kind in ("requests", "limits") for name in out.get(kind) or {}}
    missing = {name: value for name, value in defaults_.items() if name not in named}
    if missing:
        out["requests"] = {**(out.get("requests") or {}), **missing}
    return out


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
    sizes: SizeLimits | None = None,
    health: str | None = None,
) -> dict[str, Any]:
    """One data-plane container (``health``: see :func:`probes`). A missing model ends the process with a message in
    ``/dev/termination-log``; ``FallbackToLogsOnError`` keeps the log's tail when it could not write one.
    With ``drain`` the container's preStop hook drains it (a target); a GPU container gets ``/dev/shm``."""
    _, shm_mounts = lifecycle.shm(resources, (sizes or SizeLimits()).shm)
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
        **probes(probe_port, lc, health),
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
    sizes: SizeLimits | None = None,
) -> dict[str, Any]:
    """A pod spec around one container, with the placement's node selector and tolerations, and the model's
    volumes and downloader (:mod:`.modelsource`). Every emptyDir has a ``sizeLimit`` (``sizes``)."""
    sizes = sizes or SizeLimits()
    spec: dict[str, Any] = {
        "containers": [container_spec],
        "volumes": [
            {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": sizes.tmp}},
            *modelsource.volumes(model, sizes.model),
            *lifecycle.shm(container_spec.get("resources") or {}, sizes.shm)[0],
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
