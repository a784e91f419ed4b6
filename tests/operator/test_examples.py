"""examples/: the StarSDCluster and the models recipe fit the CRD, and the recipe's paths agree with it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from starsd_operator import constants as c
from starsd_operator import spec as specmod
from starsd_operator.modelsource import ClaimSource, ModelSource

from . import factories as f
from .test_crd import errors

EXAMPLES = f.REPO / "examples"


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as `kubectl patch --type=merge` applies it."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def schema() -> dict[str, Any]:
    root: dict[str, Any] = f.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def test_the_claim_patch_turns_the_example_into_a_valid_cluster_that_mounts_the_claim() -> None:
    patch = yaml.safe_load((EXAMPLES / "models" / "from-claim.yaml").read_text())
    patched = merge(f.sample(), patch)
    assert errors(schema(), patched) == []
    parsed = specmod.parse(patched["spec"])
    assert parsed.draft.model == ModelSource(pvc=ClaimSource("starsd-models", "draft"))
    assert parsed.target.model == ModelSource(pvc=ClaimSource("starsd-models", "target"))


def test_the_claim_the_patch_names_is_the_one_the_recipe_creates() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "models" / "models-pvc.yaml").read_text()))
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    (loader,) = [d for d in docs if d["kind"] == "Pod"]
    patch = yaml.safe_load((EXAMPLES / "models" / "from-claim.yaml").read_text())
    assert patch["spec"]["draft"]["model"]["pvc"]["claimName"] == claim["metadata"]["name"]
    assert loader["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert loader["spec"]["securityContext"]["runAsUser"] == c.RUN_AS_USER


def test_the_derived_image_puts_the_checkpoints_where_the_example_looks() -> None:
    dockerfile = (EXAMPLES / "models" / "Dockerfile").read_text()
    sample = f.sample()["spec"]
    for role in ("draft", "target"):
        path = sample[role]["model"]["path"]
        assert f"COPY models/{role} {path}\n" in dockerfile, role
        assert Path(f.REPO / "models" / role / "config.json").is_file(), role


HINT = re.compile(r"^\s*#\s+(model:\s*\{.*\})\s*$")


def test_every_inline_model_hint_in_the_examples_is_a_model_the_crd_accepts() -> None:
    hints = [
        (path.name, yaml.safe_load(m.group(1))["model"])
        for path in sorted(EXAMPLES.rglob("*.yaml"))
        for line in path.read_text().splitlines()
        if (m := HINT.match(line))
    ]
    assert hints, "the example shows how to load a model from a claim"
    for name, model in hints:
        cluster = f.sample()
        cluster["spec"]["draft"]["model"] = model
        assert errors(schema(), cluster) == [], f"{name}: {model}"
        specmod.parse(cluster["spec"])  # one source, as the operator reads it


def test_the_hint_check_refuses_the_fields_of_a_claim_given_as_a_model() -> None:
    cluster = f.sample()
    cluster["spec"]["draft"]["model"] = {"claimName": "m", "subPath": "draft", "path": "/models/draft"}
    assert errors(schema(), cluster) != []


NODES = f.REPO / "e2e" / "cluster" / "nodes.yaml"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def fits(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    """The scheduler's node selector and taint checks (NoSchedule taints, Exists and Equal tolerations)."""
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False

    def tolerated(taint: dict[str, Any]) -> bool:
        return any(
            t.get("key") == taint["key"]
            and t.get("effect", taint["effect"]) == taint["effect"]
            and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
            for t in pod.get("tolerations") or []
        )

    return all(tolerated(t) for t in (node.get("spec") or {}).get("taints") or [] if t["effect"] == "NoSchedule")


def test_the_examples_pools_select_gpu_products_and_tolerate_the_gpu_taint() -> None:
    parsed = specmod.parse(f.sample()["spec"])
    products = {p.name: p.placement.node_selector for p in parsed.pools}
    assert products == {
        "h100": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "l4": {"nvidia.com/gpu.product": "NVIDIA-L4"},
    }
    assert parsed.draft.placement.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    for placement in [parsed.draft.placement, *(p.placement for p in parsed.pools)]:
        assert GPU_TOLERATION in placement.tolerations
        assert placement.resources["limits"]["nvidia.com/gpu"] == "1"


def test_the_examples_pods_land_on_the_test_clusters_fake_gpu_nodes_of_their_product() -> None:
    from starsd_operator import draft, targets
    from starsd_operator.podspec import Images

    nodes = yaml.safe_load(NODES.read_text())["items"]
    parsed = specmod.parse(f.sample()["spec"])
    built = {"draft": draft.deployment(f.OWNER, parsed, Images())}
    built |= {p.name: targets.statefulset(f.OWNER, parsed, p, 1, Images()) for p in parsed.pools}
    for role, obj in built.items():
        pod = obj["spec"]["template"]["spec"]
        product = pod["nodeSelector"]["nvidia.com/gpu.product"]
        landing = {n["metadata"]["name"] for n in nodes if fits(pod, n)}
        expected = {
            n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get("nvidia.com/gpu.product") == product
        }
        assert landing == expected and landing, role
        untolerated = {**pod, "tolerations": []}
        tainted = {n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("taints")}
        assert not {n["metadata"]["name"] for n in nodes if fits(untolerated, n)} & tainted, role
    assert any(n["spec"].get("taints") for n in nodes), "the test cluster's h100 nodes are tainted as GPU nodes are"
