"""The operator's only door to the API server: apply, list and delete children; move the target count.

Children are written with server-side apply (field manager ``starsd-operator``, forced): the same request
creates a missing child, updates a drifted one and is a no-op when nothing changed, which makes create,
resume and update one idempotent path. Bodies go out and come back as plain dicts.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import constants as c
from . import metrics

APPLY = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON
JSON_PATCH = "application/json-patch+json"
TIMEOUT = 30

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """An API request failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def permanent(self) -> bool:
        """A request the API server refused as invalid: repeating it cannot help until the spec changes."""
        return self.status in (400, 422)

    @property
    def namespace_terminating(self) -> bool:
        """A write refused because the namespace is being deleted: nothing there needs repairing any more."""
        return self.status == 403 and ("NamespaceTerminating" in str(self) or "is being terminated" in str(self))


class Kube(Protocol):
    """What the controller needs from the API server (a fake implements it in the tests)."""

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    def delete(self, kind: str, namespace: str, name: str) -> None: ...

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    def swap_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool: ...

    def swap_draft_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool: ...


def load_config() -> None:
    """The in-cluster service account when running in a pod, else the current kubeconfig context."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


@dataclass(frozen=True)
class _Kind:
    api: str  # attribute of kubernetes.client
    snake: str  # the client's method suffix


_KINDS = {
    "Deployment": _Kind("AppsV1Api", "deployment"),
    "StatefulSet": _Kind("AppsV1Api", "stateful_set"),
    "Service": _Kind("CoreV1Api", "service"),
    "NetworkPolicy": _Kind("NetworkingV1Api", "network_policy"),
    "Pod": _Kind("CoreV1Api", "pod"),
    "PodDisruptionBudget": _Kind("PolicyV1Api", "pod_disruption_budget"),
    # Read only: the Secret of spec.auth.apiKeySecretRef (its existence, and a digest of its key: .apikey).
    "Secret": _Kind("CoreV1Api", "secret"),
    # Read only: an HPA on a cluster's scale subresource makes the rebalancer step aside.
    "HorizontalPodAutoscaler": _Kind("AutoscalingV2Api", "horizontal_pod_autoscaler"),
}


class ApiServer:
    """:class:`Kube` over the official client (``kubernetes.client``), configured by :func:`load_config`."""

    def __init__(self) -> None:
        from kubernetes import client

        self._client = client
        self._api = client.ApiClient()

    def _method(self, kind: str, verb: str) -> Callable[..., Any]:
        spec = _KINDS.get(kind)
        if spec is None:
            raise ValueError(f"kind {kind} is not one the operator manages")
        api = getattr(self._client, spec.api)(self._api)
        method: Callable[..., Any] = getattr(api, f"{verb}_namespaced_{spec.snake}")
        return method

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The object as the API server keeps it after the apply."""
        meta = obj["metadata"]
        patch = self._method(obj["kind"], "patch")
        metrics.API_REQUESTS.labels(verb="apply", kind=obj["kind"]).inc()
        return _call(
            patch,
            name=meta["name"],
            namespace=meta["namespace"],
            body=dict(obj),
            field_manager=c.FIELD_MANAGER,
            force=True,
            _content_type=APPLY,
        )

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        metrics.API_REQUESTS.labels(verb="list", kind=kind).inc()
        data = _call(self._method(kind, "list"), namespace=namespace, label_selector=selector)
        items: list[dict[str, Any]] = data.get("items") or []
        return items

    def delete(self, kind: str, namespace: str, name: str) -> None:
        metrics.API_REQUESTS.labels(verb="delete", kind=kind).inc()
        try:
            _call(self._method(kind, "delete"), name=name, namespace=namespace, propagation_policy="Background")
        except KubeError as exc:
            if exc.status != 404:
                raise

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object by name; None when it does not exist."""
        try:
            return _call(self._method(kind, "read"), name=name, namespace=namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def swap_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool:
        """Set ``spec.targets.replicas`` to ``new`` if it still is ``expected``, in one atomic JSON patch;
        False when someone changed it in between (the ``test`` operation failed)."""
        return self._swap(namespace, name, "/spec/targets/replicas", expected, new)

    def swap_draft_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool:
        """:meth:`swap_replicas` for ``spec.draft.replicas`` (the rebalancer's draft count)."""
        return self._swap(namespace, name, "/spec/draft/replicas", expected, new)

    def _swap(self, namespace: str, name: str, path: str, expected: int, new: int) -> bool:
        api = self._client.CustomObjectsApi(self._api)
        metrics.API_REQUESTS.labels(verb="patch", kind=c.KIND).inc()
        ops = [
            {"op": "test", "path": path, "value": expected},
            {"op": "replace", "path": path, "value": new},
        ]
        try:
            _call(
                api.patch_namespaced_custom_object,
                group=c.GROUP,
                version=c.VERSION,
                namespace=namespace,
                plural=c.PLURAL,
                name=name,
                body=ops,
                field_manager=c.FIELD_MANAGER,
                _content_type=JSON_PATCH,
            )
        except KubeError as exc:
            if exc.status in (409, 422):  # the test failed (or the new count was refused): nothing changed
                log.info("%s of %s/%s not moved %d -> %d: %s", path, namespace, name, expected, new, exc)
                return False
            raise
        return True


def list_clusters(namespace: str | None) -> list[dict[str, Any]]:
    """Every StarSDCluster (in ``namespace``, or everywhere), as plain dicts."""
    from kubernetes import client

    api = client.CustomObjectsApi(client.ApiClient())
    metrics.API_REQUESTS.labels(verb="list", kind=c.KIND).inc()
    if namespace:
        data = _call(
            api.list_namespaced_custom_object, group=c.GROUP, version=c.VERSION, namespace=namespace, plural=c.PLURAL
        )
    else:
        data = _call(api.list_cluster_custom_object, group=c.GROUP, version=c.VERSION, plural=c.PLURAL)
    items: list[dict[str, Any]] = data.get("items") or []
    return items


Store = Callable[[str], Iterable[Mapping[str, Any]]]  # namespace -> the watched objects of one kind there


class Watched:
    """:class:`Kube` whose ``list`` of a watched kind answers from memory (the operator's watches: kopf
    indices, see :mod:`.handlers`) and sends everything else to ``api``."""

    def __init__(self, api: Kube, stores: Mapping[str, Store]) -> None:
        self._api = api
        self._stores = dict(stores)

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self._api.apply(obj)

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        store = self._stores.get(kind)
        if store is None:
            return self._api.list(kind, namespace, selector)
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        return [
            copy.deepcopy(dict(obj))
            for obj in store(namespace)
            if wanted.items() <= ((obj.get("metadata") or {}).get("labels") or {}).items()
        ]

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._api.delete(kind, namespace, name)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._api.get(kind, namespace, name)  # by name: the API key's Secret, never watched

    def swap_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool:
        return self._api.swap_replicas(namespace, name, expected, new)

    def swap_draft_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool:
        return self._api.swap_draft_replicas(namespace, name, expected, new)


def _call(method: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    """Call a client method for its raw JSON (no model classes), turning failures into :class:`KubeError`."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = method(**kwargs, _preload_content=False, _request_timeout=TIMEOUT)
    except ApiException as exc:
        raise KubeError(int(exc.status or 0), _message(exc.body) or str(exc.reason)) from exc
    except (HTTPError, OSError) as exc:  # connection refused, TLS, timeouts
        raise KubeError(0, f"API server unreachable: {exc}") from exc
    body = response.data
    if not body:
        return {}
    decoded: dict[str, Any] = json.loads(body)
    return decoded


def _message(body: Any) -> str:
    """The ``message`` of a ``Status`` error body, else the body itself."""
    if not body:
        return ""
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        return str(body)
    return str(status.get("message") or body) if isinstance(status, dict) else str(body)
