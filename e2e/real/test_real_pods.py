"""From `helm install` to a served completion, with real pods on the real node (make e2e-real).

One StarSDCluster lives through the module, step by step as a user would drive it: the chart's operator runs
in-cluster from the built image under its own ServiceAccount; a draft and a 2-target pool land on the real
node; completions through the client Service equal the target alone; the draft pod is deleted (completions go
on, alone, and drafting resumes on the new pod); the pool scales to 3; the NetworkPolicy is checked as far as
the CNI can enforce it; deleting the resource removes every pod.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.kube import Cluster, wait_until
from e2e.operator_process import install_chart
from e2e.starsd_cluster import RESOURCE, apply, wait_ready
from starsd.checkpoints import LoadedModel, load_checkpoint
from starsd.local import http_json
from tests.support.reference import autoregressive_reference

REPO = Path(__file__).resolve().parents[2]
REAL = {"node.starsd.io/real": "true"}  # the real node's label (e2e/cluster/lib/node.sh)
NAME = "chat"
MAX_TOKENS = 16
PROMPTS = ["def __init__(self", "import os\nimport sys\n", "for i in range("]
POD_TIMEOUT = 300  # a cold model load on a busy 2-core machine
# The first test also waits for the cluster: its real node imports the images into containerd when they
# changed (about a minute per GB).
pytestmark = pytest.mark.timeout(1800)


def manifest(replicas: int) -> dict[str, Any]:
    small = {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
    return {
        "apiVersion": "starsd.io/v1alpha1",
        "kind": "StarSDCluster",
        "metadata": {"name": NAME},
        "spec": {
            "draft": {"model": {"path": "/models/draft"}, "nodeSelector": REAL, "resources": small},
            "target": {"model": {"path": "/models/target"}, "gamma": 4},
            "targets": {"replicas": replicas},
            "pools": [{"name": "real", "nodeSelector": REAL, "resources": small, "minReplicas": 0, "maxReplicas": 4}],
            "autoscaling": {"enabled": False},
        },
    }


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"real-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator_in_cluster(cluster: Cluster) -> None:
    """The chart with the images `make images` built (tag dev; the data-plane ones with the shipped models at
    /models, tag dev-models, as e2e/cluster/lib/node.sh derives them), its operator pod on the real node."""
    install_chart(
        cluster,
        "--set", "operator.image.tag=dev", "--set", "images.draft.tag=dev-models",
        "--set", "images.target.tag=dev-models",
        "--set-json", f"operator.nodeSelector={json.dumps(REAL)}",
        "--timeout", f"{POD_TIMEOUT}s",
    )  # fmt: skip


@pytest.fixture(scope="module")
def target_alone() -> LoadedModel:
    return load_checkpoint(REPO / "models" / "target")


def greedy_alone(model: LoadedModel, prompt: str) -> list[int]:
    out = autoregressive_reference(model, model.tokenizer.encode(prompt), MAX_TOKENS)
    return out[: out.index(model.eos_token_id)] if model.eos_token_id in out else out


def client_url(cluster: Cluster, namespace: str) -> str:
    """The client Service's cluster IP: kube-proxy on this machine routes it to a target pod."""
    service = cluster.get("service", NAME, namespace)
    return f"http://{service['spec']['clusterIP']}:8000"


def complete(url: str, prompt: str) -> dict[str, Any]:
    status, body = http_json(f"{url}/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200, body
    return dict(body)


def pods(cluster: Cluster, namespace: str, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component={component}"
    return list(cluster.get("pods", namespace=namespace, selector=selector))


@pytest.fixture(scope="module")
def star(cluster: Cluster, operator_in_cluster: None, namespace: str) -> str:
    apply(cluster, namespace, manifest(2))
    wait_ready(cluster, namespace, NAME, 2, timeout=POD_TIMEOUT)
    return namespace


def test_the_operator_runs_in_cluster_on_the_real_node_under_its_service_account(
    cluster: Cluster, operator_in_cluster: None
) -> None:
    (pod,) = cluster.get("pods", namespace="starsd-system", selector="app.kubernetes.io/component=operator")
    assert pod["spec"]["nodeName"] == "real-0"
    assert pod["spec"]["serviceAccountName"] != "default"
    assert pod["status"]["containerStatuses"][0]["ready"], pod["status"]


def test_draft_and_targets_run_on_the_real_node(cluster: Cluster, star: str) -> None:
    running = pods(cluster, star, "draft") + pods(cluster, star, "target")
    assert len(running) == 3
    for pod in running:
        assert pod["spec"]["nodeName"] == "real-0", pod["metadata"]["name"]
        assert all(s["ready"] for s in pod["status"]["containerStatuses"]), pod["metadata"]["name"]


def test_completions_through_the_client_service_equal_the_target_alone(
    cluster: Cluster, star: str, target_alone: LoadedModel
) -> None:
    url, drafted, targets = client_url(cluster, star), 0, set()
    for prompt in PROMPTS * 2:
        body = complete(url, prompt)
        assert body["starsd"]["token_ids"] == greedy_alone(target_alone, prompt), prompt
        drafted += body["starsd"]["drafted_tokens"]
        targets.add(body["starsd"]["target"])
    assert drafted > 0, "the targets never used the draft (cluster DNS or the draft Service?)"


def test_deleting_the_draft_pod_keeps_completions_going_and_drafting_resumes(
    cluster: Cluster, star: str, target_alone: LoadedModel
) -> None:
    url = client_url(cluster, star)
    (old,) = pods(cluster, star, "draft")
    cluster.kubectl("delete", "pod", old["metadata"]["name"], "-n", star, "--wait=false")
    alone = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and alone == 0:  # while the draft is away: served, and lossless
        body = complete(url, PROMPTS[0])
        assert body["starsd"]["token_ids"] == greedy_alone(target_alone, PROMPTS[0])
        alone += body["starsd"]["fallback_tokens"]
    assert alone > 0, "no completion ran without the draft while its pod was replaced"

    def drafting_again() -> bool:
        body = complete(url, PROMPTS[1])
        assert body["starsd"]["token_ids"] == greedy_alone(target_alone, PROMPTS[1])
        return body["starsd"]["drafted_tokens"] > 0 and body["starsd"]["fallback_tokens"] == 0

    wait_until("drafting on the new draft pod", drafting_again, POD_TIMEOUT)
    # The Deployment's new draft pod (the old one may still be terminating); the target found it by its DNS name.
    (new,) = [p for p in pods(cluster, star, "draft") if not p["metadata"].get("deletionTimestamp")]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]


def test_scaling_to_three_adds_a_real_target_that_serves(cluster: Cluster, star: str) -> None:
    cluster.kubectl("scale", RESOURCE, NAME, "-n", star, "--replicas", "3")
    wait_ready(cluster, star, NAME, 3, timeout=POD_TIMEOUT)
    targets = pods(cluster, star, "target")
    assert len(targets) == 3 and all(p["spec"]["nodeName"] == "real-0" for p in targets)
    third = max(targets, key=lambda p: p["metadata"]["creationTimestamp"])
    body = complete(f"http://{third['status']['podIP']}:8000", PROMPTS[2])
    assert body["starsd"]["drafted_tokens"] > 0


def test_the_draft_network_policy(cluster: Cluster, star: str) -> None:
    policy = cluster.get("networkpolicy", f"{NAME}-draft", star)
    ingress = policy["spec"]["ingress"]
    assert ingress[0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "target"
    pytest.skip(
        "the real node's CNI (bridge + host-local) does not enforce NetworkPolicy: the policy is checked as an "
        "object only; enforcing it needs a policy-capable CNI (Calico, Cilium), which this machine cannot fetch"
    )


def test_deleting_the_cluster_removes_every_pod(cluster: Cluster, star: str) -> None:
    cluster.kubectl("delete", RESOURCE, NAME, "-n", star)
    wait_until(
        "every pod gone",
        lambda: not cluster.get("pods", namespace=star),
        120,
    )
