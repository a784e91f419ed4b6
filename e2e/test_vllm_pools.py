"""A pool with ``engine: vllm`` on the real API server: the CRD's CEL rules refuse engine fields on the wrong
engine (and the flags the operator sets) with the field named, and a valid vLLM pool is reconciled into a
StatefulSet whose container runs ``vllm serve`` with StarSD's proposer, beside a StarSD pool, behind the same
Services and NetworkPolicies (the pods need not really run vLLM: the nodes are kwok's)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until

pytestmark = pytest.mark.usefixtures("operator")  # the chart installed the CRD

VLLM_IMAGE = "registry.example/vllm-starsd:0.32.0"


def as_vllm(pool: dict[str, Any], args: list[str] | None = None) -> None:
    pool.update(engine="vllm", image=VLLM_IMAGE, vllm={"args": args or ["--max-num-seqs", "128"]})


def operator_flag_in_args(spec: dict[str, Any]) -> None:
    as_vllm(spec["pools"][1], ["--max-model-len", "8192", "--port=9000"])


def underscore_operator_flag(spec: dict[str, Any]) -> None:
    as_vllm(spec["pools"][1], ["--served_model_name", "other"])


def vllm_pool_without_image(spec: dict[str, Any]) -> None:
    as_vllm(spec["pools"][1])
    del spec["pools"][1]["image"]


def vllm_args_on_a_starsd_pool(spec: dict[str, Any]) -> None:
    spec["pools"][0]["vllm"] = {"args": ["--max-num-seqs", "128"]}


def image_on_a_starsd_pool(spec: dict[str, Any]) -> None:
    spec["pools"][0]["image"] = VLLM_IMAGE


def unknown_engine(spec: dict[str, Any]) -> None:
    spec["pools"][0]["engine"] = "tgi"


INVALID: list[tuple[Callable[[dict[str, Any]], None], list[str]]] = [
    (operator_flag_in_args, ["spec.pools[1].vllm.args", "vllm.args: --port is set by the operator"]),
    (underscore_operator_flag, ["spec.pools[1].vllm.args", "--served_model_name is set by the operator"]),
    (vllm_pool_without_image, ["spec.pools[1].image", "pool l4: engine vllm needs an image"]),
    (vllm_args_on_a_starsd_pool, ["spec.pools[0].vllm", "pool h100: vllm applies to engine vllm only"]),
    (image_on_a_starsd_pool, ["spec.pools[0].image", "pool h100: image applies to engine vllm only"]),
    (unknown_engine, ["spec.pools[0].engine", 'Unsupported value: "tgi"']),
]


@pytest.mark.parametrize(("mutate", "messages"), INVALID, ids=[m.__name__ for m, _ in INVALID])
def test_the_api_server_refuses_engine_fields_on_the_wrong_engine(
    cluster: Cluster, namespace: str, mutate: Callable[[dict[str, Any]], None], messages: list[str]
) -> None:
    doc = ssd.sample("bad")
    mutate(doc["spec"])
    proc = cluster.apply(yaml.safe_dump(doc), namespace=namespace, check=False)
    assert proc.returncode != 0, f"the API server accepted {mutate.__name__}"
    for message in messages:
        assert message in proc.stderr, proc.stderr
    assert cluster.get(ssd.RESOURCE, namespace=namespace) == []


def _statefulset(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        items = [o for o in cluster.get("statefulsets", namespace=namespace) if o["metadata"]["name"] == name]
        return items[0] if items else None

    return wait_until(f"StatefulSet {name}", found, timeout=60)


def test_a_vllm_pool_is_reconciled_into_vllm_serve_beside_a_starsd_pool(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("mix")
    spec = doc["spec"]
    spec["target"]["gamma"] = 5
    as_vllm(spec["pools"][1], ["--max-num-seqs", "128", "--gpu-memory-utilization=0.9"])
    ssd.apply(cluster, namespace, doc)
    stored = ssd.get(cluster, namespace, "mix")["spec"]
    assert stored["pools"][0]["engine"] == "starsd"  # the CRD's default: existing pools are StarSD pools

    vllm_sts = _statefulset(cluster, namespace, "mix-target-l4")
    [server] = vllm_sts["spec"]["template"]["spec"]["containers"]
    command = server["command"]
    assert server["image"] == VLLM_IMAGE
    assert command[:3] == ["vllm", "serve", "/models/target"]
    assert command[command.index("--port") + 1] == "8000"
    assert command[command.index("--served-model-name") + 1] == "target"
    speculative = json.loads(command[command.index("--speculative-config") + 1])
    assert speculative == {
        "method": "custom_class",
        "model": "starsd.integrations.vllm.StarSDProposer",
        "num_speculative_tokens": 5,
    }
    assert command[-3:] == ["--max-num-seqs", "128", "--gpu-memory-utilization=0.9"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in server["env"]}
    assert env["STARSD_DRAFT"] == f"dns:mix-draft-pods.{namespace}.svc:50051"
    assert env["STARSD_TARGET_ID"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"

    starsd_sts = _statefulset(cluster, namespace, "mix-target-h100")
    [star] = starsd_sts["spec"]["template"]["spec"]["containers"]
    assert star["command"][:2] == ["starsd", "target"]
    assert star["command"][star["command"].index("--drafts-from") + 1] == env["STARSD_DRAFT"]

    # The draft admits the vLLM pool's pods as it admits any target's, and the client Service selects them.
    labels = vllm_sts["spec"]["template"]["metadata"]["labels"]
    policy = cluster.get("networkpolicies", "mix-draft", namespace)
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= labels.items()
    client = cluster.get("services", "mix", namespace)
    assert client["spec"]["selector"].items() <= labels.items()

    # The target count is split over both pools as for any pools.
    replicas = wait_until(
        "both pools to get targets",
        lambda: r if len(r := ssd.statefulset_replicas(cluster, namespace, "mix")) == 2 else None,
    )
    assert replicas["h100"] >= 1 and replicas["l4"] >= 1, replicas
    cluster.kubectl("delete", ssd.RESOURCE, "mix", "-n", namespace, "--wait=false")
