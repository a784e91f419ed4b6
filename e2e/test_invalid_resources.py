"""Issue 4's scenario 3: the API server itself refuses invalid StarSDClusters, with a clear message (the
CRD's schema and CEL rules), before the operator ever sees them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster

pytestmark = pytest.mark.usefixtures("operator")  # the chart installed the CRD


def autoscaling_min_above_max(spec: dict[str, Any]) -> None:
    spec["autoscaling"].update(minTargets=8, maxTargets=4, enabled=False)


def pool_min_above_max(spec: dict[str, Any]) -> None:
    spec["pools"][0].update(minReplicas=5, maxReplicas=2)


def duplicate_pool_names(spec: dict[str, Any]) -> None:
    spec["pools"][1]["name"] = spec["pools"][0]["name"]


def gamma_zero(spec: dict[str, Any]) -> None:
    spec["target"]["gamma"] = 0


def no_pools(spec: dict[str, Any]) -> None:
    spec["pools"] = []


def unknown_field(spec: dict[str, Any]) -> None:
    spec["targets"]["replicaz"] = 3


def negative_replicas(spec: dict[str, Any]) -> None:
    spec["targets"]["replicas"] = -1


def no_source(spec: dict[str, Any]) -> None:
    spec["draft"]["model"] = {}


def two_sources(spec: dict[str, Any]) -> None:
    spec["target"]["model"] = {"path": "/models/target", "uri": "hf://org/target"}


def unknown_scheme(spec: dict[str, Any]) -> None:
    spec["pools"][0]["model"] = {"uri": "ftp://host/model.tar.gz"}


def cache_without_uri(spec: dict[str, Any]) -> None:
    spec["draft"]["model"] = {"path": "/models/draft", "cache": {"claimName": "c"}}


def sub_path_escapes(spec: dict[str, Any]) -> None:
    spec["draft"]["model"] = {"pvc": {"claimName": "c", "subPath": "a/../../etc"}}


# (mutation, what the refusal must name: the fields involved and the reason)
INVALID: list[tuple[Callable[[dict[str, Any]], None], list[str]]] = [
    (autoscaling_min_above_max, ["minTargets", "maxTargets"]),
    (pool_min_above_max, ["minReplicas", "maxReplicas"]),
    (duplicate_pool_names, ["spec.pools", "Duplicate value"]),
    (gamma_zero, ["gamma", "16"]),
    (no_pools, ["at least one pool"]),
    (unknown_field, ['unknown field "spec.targets.replicaz"']),
    (negative_replicas, ["spec.targets.replicas", "greater than or equal to 0"]),
    (no_source, ["spec.draft.model", "exactly one source"]),
    (two_sources, ["spec.target.model", "exactly one source"]),
    (unknown_scheme, ["spec.pools[0].model.uri", "hf://ORG/NAME"]),
    (cache_without_uri, ["spec.draft.model", "uri source only"]),
    (sub_path_escapes, ["spec.draft.model.pvc.subPath", "'..'"]),
]


@pytest.mark.parametrize(("mutate", "messages"), INVALID, ids=[m.__name__ for m, _ in INVALID])
def test_api_server_refuses_invalid_cluster_with_a_clear_message(
    cluster: Cluster, namespace: str, mutate: Callable[[dict[str, Any]], None], messages: list[str]
) -> None:
    doc = ssd.sample("bad")
    mutate(doc["spec"])
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0, f"the API server accepted {mutate.__name__}"
    for message in messages:
        assert message in proc.stderr, proc.stderr
    assert cluster.get(ssd.RESOURCE, namespace=namespace) == []


def test_the_unmodified_sample_is_accepted(cluster: Cluster, namespace: str) -> None:
    """The control for the refusals above: each differs from an accepted resource by its one mutation."""
    doc = ssd.sample("good")
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode == 0, proc.stderr
    cluster.kubectl("delete", ssd.RESOURCE, "good", "-n", namespace, "--wait=false")
