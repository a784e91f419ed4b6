"""One source of truth for the CRD: the chart ships crds/starsdcluster.yaml itself, and the sample the chart
renders fits the CRD's schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import yaml

from .conftest import CHART, REPO, Rendered, run_helm

CRD_FILE = REPO / "crds" / "starsdcluster.yaml"
CHART_CRD = CHART / "crds" / "starsdcluster.yaml"


def test_chart_crd_is_the_crd_in_crds() -> None:
    assert CHART_CRD.exists(), f"{CHART_CRD} is missing (it should link to {CRD_FILE})"
    assert CHART_CRD.read_bytes() == CRD_FILE.read_bytes(), (
        f"{CHART_CRD} differs from {CRD_FILE}: restore the link with "
        "`ln -sf ../../../crds/starsdcluster.yaml charts/starsd/crds/starsdcluster.yaml`"
    )


def test_helm_ships_exactly_that_crd(helm: str) -> None:
    proc = run_helm(helm, "show", "crds", str(CHART))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    ours = [d for d in docs if d["spec"]["group"] == "starsd.io"]
    assert ours == [yaml.safe_load(CRD_FILE.read_text())]
    # Besides it, only kopf's peering CRDs (the operator's replicas elect the active one with them).
    assert sorted(d["metadata"]["name"] for d in docs if d not in ours) == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ]


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    return dict(version["schema"]["openAPIV3Schema"])


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the structural schema does not declare (the API server would prune or, strictly, refuse them)."""
    found: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


@pytest.mark.parametrize("values", ["sample.yaml", "custom-pools.yaml", "vllm-pool.yaml"])
def test_rendered_sample_fits_the_crd_schema(render: Callable[..., Rendered], values: str) -> None:
    sample = render(values).one("StarSDCluster")
    schema = crd_schema()
    # metadata is ObjectMeta, which the API server handles itself; the spec is ours.
    assert unknown_fields(sample["spec"], schema["properties"]["spec"], ".spec") == []
    jsonschema.validate(sample["spec"], schema["properties"]["spec"])


def test_a_vllm_pool_in_the_values_reaches_the_cluster_as_the_operator_reads_it(
    render: Callable[..., Rendered],
) -> None:
    from starsd_operator import spec as specmod

    parsed = specmod.parse(render("vllm-pool.yaml").one("StarSDCluster")["spec"])
    assert [(p.name, p.engine) for p in parsed.pools] == [("h100", "starsd"), ("h100-vllm", "vllm")]
    assert parsed.pools[1].image == "registry.example/vllm-starsd:0.32.0"
    assert parsed.pools[1].vllm_args == ("--max-num-seqs", "128", "--gpu-memory-utilization", "0.9")


def test_unknown_field_check_finds_a_typo() -> None:
    pools: dict[str, Any] = {"items": {"properties": {"name": {}}}}
    schema: dict[str, Any] = {"properties": {"spec": {"properties": {"pools": pools}}}}
    assert unknown_fields({"spec": {"pools": [{"name": "a", "wieght": 2}]}}, schema) == [".spec.pools[0].wieght"]
