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

    def put(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(dict(obj))

    def apply(self, obj: Mapping[str, Any]) -> None:
        if self.fail_apply is not None:
            raise self.fail_apply
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        stored = copy.deepcopy(dict(obj))
        if key in self.objects and "status" in self.objects[key]:
            stored["status"] = self.objects[key]["status"]
        self.objects[key] = stored
        self.applied.append((obj["kind"], obj["metadata"]["name"]))

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
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "replicas": n,
                    "readyReplicas": n,
                    "updatedReplicas": n,
                }
