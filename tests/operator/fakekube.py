"""An in-memory API server for the controller's tests: stores applied objects, lists them by label."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from starsd_operator.kube import KubeError


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.applied: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str]] = []
        self.swaps: list[tuple[int, int]] = []
        self.draft_swaps: list[tuple[int, int]] = []  # spec.draft.replicas (expected, new)
        self.swap_ok = True
        self.fail_apply: KubeError | None = None
        self.fail_list: KubeError | None = None
        self.fail_delete: KubeError | None = None
        self.fail_get: KubeError | None = None
        self.got: list[tuple[str, str]] = []  # (kind, name) of every get
        self.version = 0  # the last resourceVersion handed out

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def put(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(dict(obj))

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Like server-side apply with force: the applied fields replace the stored ones, whatever else the
        stored object holds stays; the resourceVersion moves only when something changed."""
        if self.fail_apply is not None:
            raise self.fail_apply
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        old = self.objects.get(key)
        stored = _merged(copy.deepcopy(old) if old else {}, copy.deepcopy(dict(obj)))
        if old is None or _content(stored) != _content(old):
            self._bump(stored)
        self.objects[key] = stored
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        return copy.deepcopy(stored)

    def edit(self, kind: str, namespace: str, name: str, change: Any) -> None:
        """Someone else's write: ``change(obj)`` edits the stored object in place."""
        obj = self.objects[(kind, namespace, name)]
        change(obj)
        self._bump(obj)

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        if self.fail_list is not None:
            raise self.fail_list
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and ns == namespace and wanted.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if self.fail_get is not None:
            raise self.fail_get
        self.got.append((kind, name))
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def delete(self, kind: str, namespace: str, name: str) -> None:
        if self.fail_delete is not None:
            raise self.fail_delete
        self.objects.pop((kind, namespace, name), None)
        self.deleted.append((kind, name))

    def swap_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool:
        self.swaps.append((expected, new))
        return self.swap_ok

    def swap_draft_replicas(self, namespace: str, name: str, expected: int, new: int) -> bool:
        self.draft_swaps.append((expected, new))
        return self.swap_ok

    def settle(self) -> None:
        """Play the controllers: every workload reports all of its replicas ready and up to date."""
        for (kind, _, _), obj in self.objects.items():
            if kind in ("Deployment", "StatefulSet"):
                n = obj["spec"]["replicas"]
                obj["metadata"].setdefault("generation", 1)
                self._bump(obj)
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "replicas": n,
                    "readyReplicas": n,
                    "updatedReplicas": n,
                }


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new``'s maps merged into ``old``'s, its other values replacing them (lists are replaced whole)."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            old[key] = _merged(old[key], value)
        else:
            old[key] = value
    return old


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}
