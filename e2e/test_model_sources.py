"""Model sources on the real API server: each source kind lands in the workloads as the right init container,
volumes, mounts and environment (what CEL refuses is in test_invalid_resources.py)."""

from __future__ import annotations

from typing import Any

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until

pytestmark = pytest.mark.usefixtures("operator")

MODEL_ROOT = "/var/lib/starsd/model"


def _template(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        items = [o for o in cluster.get(kind, namespace=namespace) if o["metadata"]["name"] == name]
        return items[0]["spec"]["template"]["spec"] if items else None

    return wait_until(f"{kind} {name}", found, timeout=60)


def test_each_source_kind_lands_as_init_container_volumes_and_env(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("src")
    spec = doc["spec"]
    spec["draft"]["model"] = {
        "uri": "hf://org/draft@0123abc",
        "credentials": {"secretRef": {"name": "hf-token"}},
        "cache": {"claimName": "model-cache"},
    }
    spec["target"]["model"] = {"pvc": {"claimName": "models", "subPath": "target"}}
    spec["pools"][0]["model"] = {"uri": "s3://weights/target-int8", "credentials": {"secretRef": {"name": "s3"}}}
    spec["pools"][1]["model"] = {"path": "/models/target"}
    ssd.apply(cluster, namespace, doc)
    stored = ssd.get(cluster, namespace, "src")["spec"]
    assert stored["target"]["model"]["pvc"]["readOnly"] is True  # the CRD's default

    draft = _template(cluster, namespace, "deployments", "src-draft")
    [fetch] = draft["initContainers"]
    [server] = draft["containers"]
    assert fetch["command"][:3] == ["starsd", "fetch-model", "hf://org/draft@0123abc"]
    assert fetch["command"][3].startswith("/var/lib/starsd/cache/hf-org-draft-0123abc-")
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in draft["volumes"]
    token = next(e for e in fetch["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "HF_TOKEN", "optional": False}
    assert "HF_TOKEN" not in {e["name"] for e in server["env"]}
    [mount] = [m for m in server["volumeMounts"] if m["name"] == "model-cache"]
    assert mount["mountPath"] == MODEL_ROOT and mount["readOnly"] is True
    assert mount["subPath"] == fetch["command"][3].rsplit("/", 1)[1]

    pools = spec["pools"]
    s3_pool = _template(cluster, namespace, "statefulsets", f"src-target-{pools[0]['name']}")
    [fetch] = s3_pool["initContainers"]
    assert fetch["command"] == ["starsd", "fetch-model", "s3://weights/target-int8", MODEL_ROOT]
    assert {"name": "model", "emptyDir": {"sizeLimit": "100Gi"}} in s3_pool["volumes"]  # the default sizeLimit
    keys = {e["name"] for e in fetch["env"] if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= keys

    image_pool = _template(cluster, namespace, "statefulsets", f"src-target-{pools[1]['name']}")
    assert "initContainers" not in image_pool
    [server] = image_pool["containers"]
    assert server["command"][server["command"].index("--model") + 1] == "/models/target"

    doc["spec"]["pools"][1].pop("model")  # this pool now runs the target's model: the claim
    ssd.apply(cluster, namespace, doc)

    def claim_mounted() -> dict[str, Any] | None:
        pod = _template(cluster, namespace, "statefulsets", f"src-target-{pools[1]['name']}")
        vols = [v for v in pod["volumes"] if v["name"] == "model"]
        return pod if vols and vols[0].get("persistentVolumeClaim") else None

    pod = wait_until("the pool to mount the target's claim", claim_mounted, timeout=60)
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    [server] = pod["containers"]
    assert {"name": "model", "mountPath": MODEL_ROOT, "readOnly": True, "subPath": "target"} in server["volumeMounts"]
