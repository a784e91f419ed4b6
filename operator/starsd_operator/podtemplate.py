"""A user's partial pod template (``spec.draft.podTemplate``, ``spec.pools[].podTemplate``) merged into the pod
the operator builds, the way a strategic merge patch would, with the star's own fields protected.

Rules (the same for the draft and every pool):

* **The user's fields win** wherever the star does not need its own: scalars of the pod spec
  (``priorityClassName``, ``serviceAccountName``, ``runtimeClassName``, ``terminationGracePeriodSeconds``,
  ...), ``affinity``, ``topologySpreadConstraints``, key by key in the pod's and the container's
  ``securityContext`` and ``resources``, the container's probes and ``lifecycle``.
* **Lists merge by key**: ``imagePullSecrets`` by name, ``tolerations`` appended, ``volumes`` by name,
  ``envFrom`` appended, ``env`` and ``volumeMounts`` of the serving container by name (and mount path),
  extra ``containers`` (sidecars) appended, extra ``initContainers`` placed before the model downloader
  (so a native sidecar, such as a network proxy, runs while it downloads). Maps merge by key (labels,
  annotations, ``nodeSelector``).
* **The star's fields are enforced**, and a template that sets them is refused with the field named
  (a :class:`TemplateError`, shown in ``Ready=False``), never silently dropped: the serving container's
  ``image``, ``command``, ``args`` and ``ports``; any env variable, volume, mount path or container name the
  operator sets; a label the operator sets; a ``nodeSelector`` key the spec sets to another value.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import modelsource
from .errors import SpecError

# The serving container's fields that make it the star's draft or target.
STAR_CONTAINER_FIELDS = ("image", "command", "args", "ports")
# Names the operator may use whatever the model source is now (so switching sources never breaks a template).
RESERVED_CONTAINERS = frozenset({modelsource.FETCH_CONTAINER})
RESERVED_VOLUMES = frozenset({modelsource.MODEL_VOLUME, modelsource.CACHE_VOLUME})
# Pod spec fields merged key by key (dicts) rather than replaced.
MERGED_POD_MAPS = ("securityContext", "nodeSelector")
MERGED_CONTAINER_MAPS = ("securityContext",)


class TemplateError(SpecError):
    """A pod template that is malformed or asks for what the star needs for itself; the message names the
    field. A ``SpecError``, so the controller shows it as any other spec error."""


@dataclass(frozen=True)
class PodTemplate:
    """The template as the user wrote it, and where it is in the spec (for error messages)."""

    raw: dict[str, Any] = field(default_factory=dict)
    where: str = "podTemplate"


def parse(raw: Any, where: str) -> PodTemplate | None:
    """Shape checks only (what the CRD's schema leaves open); conflicts are found by :func:`merge`."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TemplateError(f"{where} must be an object")
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise TemplateError(f"{where}.metadata and {where}.spec must be objects")
    for key in ("labels", "annotations"):
        values = meta.get(key) or {}
        if not isinstance(values, Mapping) or not all(isinstance(v, str) for v in values.values()):
            raise TemplateError(f"{where}.metadata.{key} must map keys to strings")
    for key in ("containers", "initContainers", "volumes", "tolerations", "imagePullSecrets"):
        items = spec.get(key)
        if items is not None and (not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items)):
            raise TemplateError(f"{where}.spec.{key} must be a list of objects")
    for key in ("containers", "initContainers", "volumes"):
        for i, item in enumerate(spec.get(key) or []):
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise TemplateError(f"{where}.spec.{key}[{i}].name is required")
    return PodTemplate(raw=copy.deepcopy(dict(raw)), where=where)


def merge(base: Mapping[str, Any], template: PodTemplate | None) -> dict[str, Any]:
    """``base`` (the operator's ``{metadata, spec}`` pod template) with ``template`` merged in."""
    out = copy.deepcopy(dict(base))
    if template is None:
        return out
    where = template.where
    user_meta = template.raw.get("metadata") or {}
    meta = out.setdefault("metadata", {})
    for key in ("labels", "annotations"):
        meta_values = meta.get(key) or {}
        for name, value in (user_meta.get(key) or {}).items():
            if name in meta_values and meta_values[name] != value:
                raise TemplateError(f"{where}.metadata.{key}[{name}]: the operator sets this {key[:-1]} itself")
            meta_values[name] = value
        if meta_values:
            meta[key] = meta_values
    out["spec"] = _merge_pod_spec(out.get("spec") or {}, template.raw.get("spec") or {}, f"{where}.spec")
    return out


def _merge_pod_spec(pod: dict[str, Any], user: Mapping[str, Any], where: str) -> dict[str, Any]:
    containers = pod.get("containers") or []
    init = pod.get("initContainers") or []
    star = containers[0]["name"] if containers else None
    taken = {c["name"] for c in [*containers, *init]} | RESERVED_CONTAINERS
    for key, value in user.items():
        value = copy.deepcopy(value)
        if key == "containers":
            extra = []
            for i, container in enumerate(value):
                if container["name"] == star:
                    containers[0] = _merge_star_container(containers[0], container, f"{where}.containers[{i}]")
                elif container["name"] in taken:
                    raise TemplateError(f"{where}.containers[{i}].name: {container['name']!r} is the operator's")
                else:
                    extra.append(container)
            pod["containers"] = [*containers, *extra]
        elif key == "initContainers":
            for i, container in enumerate(value):
                if container["name"] in taken:
                    raise TemplateError(f"{where}.initContainers[{i}].name: {container['name']!r} is the operator's")
            pod["initContainers"] = [*value, *init]
        elif key == "volumes":
            own_volumes = {v["name"] for v in pod.get("volumes") or []} | RESERVED_VOLUMES
            for i, volume in enumerate(value):
                if volume["name"] in own_volumes:
                    raise TemplateError(f"{where}.volumes[{i}].name: the operator's volume {volume['name']!r}")
            pod["volumes"] = [*(pod.get("volumes") or []), *value]
        elif key == "imagePullSecrets":
            names = {s.get("name") for s in pod.get("imagePullSecrets") or []}
            pod["imagePullSecrets"] = [
                *(pod.get("imagePullSecrets") or []),
                *(s for s in value if s.get("name") not in names),
            ]
        elif key == "tolerations":
            pod["tolerations"] = [*(pod.get("tolerations") or []), *(t for t in value if t not in pod.get(key, []))]
        elif key == "nodeSelector":
            selector = pod.get("nodeSelector") or {}
            for label, wanted in value.items():
                if label in selector and selector[label] != wanted:
                    raise TemplateError(
                        f"{where}.nodeSelector[{label}]: the spec's nodeSelector sets it to {selector[label]!r}"
                    )
            pod["nodeSelector"] = {**selector, **value}
        elif key in MERGED_POD_MAPS and isinstance(value, Mapping):
            pod[key] = {**(pod.get(key) or {}), **value}
        else:
            pod[key] = value
    return pod


def _merge_star_container(own: dict[str, Any], user: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = copy.deepcopy(own)
    for key, value in user.items():
        if key == "name":
            continue
        if key in STAR_CONTAINER_FIELDS:
            raise TemplateError(f"{where}.{key}: the operator sets the {own['name']} container's {key}")
        if key == "env":
            names = {e["name"] for e in own.get("env") or []}
            for i, var in enumerate(value):
                if var.get("name") in names:
                    raise TemplateError(f"{where}.env[{i}]: the operator sets {var.get('name')}")
            out["env"] = [*(own.get("env") or []), *value]
        elif key == "envFrom":
            out["envFrom"] = [*(own.get("envFrom") or []), *value]
        elif key == "volumeMounts":
            names = {m["name"] for m in own.get("volumeMounts") or []}
            paths = {m["mountPath"] for m in own.get("volumeMounts") or []}
            for i, mount in enumerate(value):
                if mount.get("name") in names or mount.get("mountPath") in paths:
                    raise TemplateError(f"{where}.volumeMounts[{i}]: the operator mounts {mount.get('mountPath')}")
            out["volumeMounts"] = [*(own.get("volumeMounts") or []), *value]
        elif key == "resources" and isinstance(value, Mapping):
            resources = copy.deepcopy(own.get("resources") or {})
            for kind, amounts in value.items():
                resources[kind] = {**(resources.get(kind) or {}), **(amounts or {})}
            out["resources"] = resources
        elif key in MERGED_CONTAINER_MAPS and isinstance(value, Mapping):
            out[key] = {**(own.get(key) or {}), **value}
        else:
            out[key] = value
    return out
