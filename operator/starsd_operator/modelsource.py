"""Where a draft's or target's model comes from, and what that adds to the pod (docs/models-and-pods.md,
"Model sources").

Exactly one source:

* ``path``: a directory in the image; the process loads it as is.
* ``pvc: {claimName, subPath, readOnly}``: a PersistentVolumeClaim mounted at :data:`MODEL_ROOT` (read-only
  unless ``readOnly: false``).
* ``uri`` (``hf://``, ``s3://``, ``gs://``, ``https://...tar.gz``, see :mod:`starsd.modeluri`): an init
  container runs the data-plane image's own ``starsd fetch-model URI DEST`` into an emptyDir, or, with
  ``cache: {claimName}``, into ``<cache>/<key>`` on a shared claim, the key unique per source and revision
  (a second pod, or a restarted one, finds it there verified and starts at once). ``credentials.secretRef``
  names a Secret whose keys become the downloader's environment: in the init container only, never in the
  serving container.

In every case but ``path`` the serving container reads the model, read-only, at :data:`MODEL_ROOT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starsd import defaults, modeluri

from .errors import SpecError

MODEL_ROOT = "/var/lib/starsd/model"
CACHE_ROOT = "/var/lib/starsd/cache"
MODEL_VOLUME = "model"
CACHE_VOLUME = "model-cache"
FETCH_CONTAINER = "fetch-model"

# The downloader's environment, per scheme, read from the credentials Secret's keys of the same names.
# Keys a scheme cannot work without are required (a Secret without them stops the pod with a clear
# CreateContainerConfigError naming the key); the others are optional.
CREDENTIAL_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "hf": (("HF_TOKEN",), ()),
    "s3": (
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        ("AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"),
    ),
    "gs": (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), ("STARSD_GCS_ENDPOINT",)),
    "https": (("STARSD_HTTP_AUTHORIZATION",), ()),
}


class ModelSpecError(SpecError):
    """A model source the operator cannot use; the message names the field."""


@dataclass(frozen=True)
class ClaimSource:
    claim_name: str
    sub_path: str | None = None
    read_only: bool = True


@dataclass(frozen=True)
class ModelSource:
    """One of ``path``, ``pvc`` or ``uri`` is set; ``secret_name`` and ``cache_claim`` go with ``uri``."""

    path: str | None = None
    pvc: ClaimSource | None = None
    uri: str | None = None
    secret_name: str | None = None
    cache_claim: str | None = None

    @property
    def serve_path(self) -> str:
        """What the serving process is given as ``--model``."""
        return self.path if self.path is not None else MODEL_ROOT


def parse(raw: Any, where: str) -> ModelSource:
    """``raw`` (a spec's ``model`` object) as a :class:`ModelSource`; ``where`` is its field path."""
    if not isinstance(raw, Mapping):
        raise ModelSpecError(f"{where} is required")
    given = [key for key in ("path", "pvc", "uri") if raw.get(key) not in (None, "")]
    if len(given) != 1:
        raise ModelSpecError(
            f"{where} needs exactly one source (path, pvc or uri), got {', '.join(given) if given else 'none'}"
        )
    if raw.get("uri") in (None, ""):
        for key in ("credentials", "cache"):
            if raw.get(key) is not None:
                raise ModelSpecError(f"{where}.{key} applies to a uri source only")
    if given == ["path"]:
        path = raw["path"]
        if not isinstance(path, str) or not path.startswith("/"):
            raise ModelSpecError(f"{where}.path must be an absolute path, got {path!r}")
        return ModelSource(path=path)
    if given == ["pvc"]:
        return ModelSource(pvc=_claim(raw["pvc"], f"{where}.pvc"))
    uri = raw["uri"]
    if not isinstance(uri, str):
        raise ModelSpecError(f"{where}.uri must be a string")
    try:
        modeluri.parse(uri)
    except modeluri.URIError as exc:
        raise ModelSpecError(f"{where}.uri: {exc}") from None
    return ModelSource(
        uri=uri,
        secret_name=_name(raw.get("credentials"), "secretRef", "name", f"{where}.credentials"),
        cache_claim=_name(raw, "cache", "claimName", where) if raw.get("cache") is not None else None,
    )


def _claim(raw: Any, where: str) -> ClaimSource:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("claimName"), str) or not raw["claimName"]:
        raise ModelSpecError(f"{where}.claimName is required")
    sub_path = raw.get("subPath") or None
    if sub_path is not None and (
        not isinstance(sub_path, str) or sub_path.startswith("/") or ".." in sub_path.split("/")
    ):
        raise ModelSpecError(f"{where}.subPath must be a relative path without '..', got {sub_path!r}")
    read_only = raw.get("readOnly", True)
    if not isinstance(read_only, bool):
        raise ModelSpecError(f"{where}.readOnly must be a boolean")
    return ClaimSource(claim_name=raw["claimName"], sub_path=sub_path, read_only=read_only)


def _name(parent: Any, key: str, field: str, where: str) -> str | None:
    """``parent[key][field]``: ``credentials.secretRef.name`` or ``cache.claimName``; ``None`` without a parent."""
    if parent is None:
        return None
    ref = parent.get(key) if isinstance(parent, Mapping) else None
    name = ref.get(field) if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ModelSpecError(f"{where}.{key}.{field} is required")
    return name


def volumes(model: ModelSource, size_limit: str = defaults.MODEL_SIZE_LIMIT) -> list[dict[str, Any]]:
    """The pod's volumes for ``model``; a download into the pod gets an emptyDir of at most ``size_limit``."""
    if model.pvc is not None:
        claim = {"claimName": model.pvc.claim_name, "readOnly": model.pvc.read_only}
        return [{"name": MODEL_VOLUME, "persistentVolumeClaim": claim}]
    if model.uri is None:
        return []
    if model.cache_claim is not None:
        return [{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": model.cache_claim}}]
    return [{"name": MODEL_VOLUME, "emptyDir": {"sizeLimit": size_limit}}]


def mounts(model: ModelSource) -> list[dict[str, Any]]:
    """The serving container's mounts: the model, read-only (unless a claim says otherwise), at MODEL_ROOT."""
    if model.pvc is not None:
        mount: dict[str, Any] = {"name": MODEL_VOLUME, "mountPath": MODEL_ROOT, "readOnly": model.pvc.read_only}
        if model.pvc.sub_path:
            mount["subPath"] = model.pvc.sub_path
        return [mount]
    if model.uri is None:
        return []
    if model.cache_claim is not None:
        return [{"name": CACHE_VOLUME, "mountPath": MODEL_ROOT, "subPath": cache_key(model), "readOnly": True}]
    return [{"name": MODEL_VOLUME, "mountPath": MODEL_ROOT, "readOnly": True}]


def cache_key(model: ModelSource) -> str:
    """The directory of ``model`` on its cache claim."""
    assert model.uri is not None
    return modeluri.cache_key(modeluri.parse(model.uri))


def download_dest(model: ModelSource) -> str:
    """Where the init container writes the model."""
    return f"{CACHE_ROOT}/{cache_key(model)}" if model.cache_claim is not None else MODEL_ROOT


def credential_env(model: ModelSource) -> list[dict[str, Any]]:
    """The credentials Secret's keys as the downloader's environment (none without a Secret)."""
    if model.uri is None or model.secret_name is None:
        return []
    required, optional = CREDENTIAL_KEYS[modeluri.parse(model.uri).scheme]
    return [
        {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": model.secret_name, "key": key, "optional": key in optional}},
        }
        for key in (*required, *optional)
    ]


def fetch_container(model: ModelSource, *, image: str, base: Mapping[str, Any]) -> dict[str, Any] | None:
    """The init container that downloads ``model`` (``None`` unless it has a ``uri``).

    ``base`` is the serving container: the downloader runs its image, under its security context, with its
    ``/tmp``; it sees the model volume read-write at the download destination, and nothing else of it.
    """
    if model.uri is None:
        return None
    if model.cache_claim is not None:
        mount = {"name": CACHE_VOLUME, "mountPath": CACHE_ROOT}
    else:
        mount = {"name": MODEL_VOLUME, "mountPath": MODEL_ROOT}
    tmp_mounts = [m for m in base.get("volumeMounts") or [] if m.get("mountPath") == "/tmp"]
    return {
        "name": FETCH_CONTAINER,
        "image": image,
        "imagePullPolicy": base.get("imagePullPolicy", "IfNotPresent"),
        "command": ["starsd", "fetch-model", model.uri, download_dest(model)],
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "HF_HOME", "value": "/tmp/huggingface"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *credential_env(model),
        ],
        "volumeMounts": [*tmp_mounts, mount],
        "securityContext": dict(base.get("securityContext") or {}),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
