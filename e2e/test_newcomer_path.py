"""What a newcomer sees on the test cluster: the env file, the chart's notes, Events and the TARGETS column,
and the shipped examples accepted by the real API server (schema and CEL rules)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until
from e2e.operator_process import RELEASE, RELEASE_NAMESPACE

pytestmark = pytest.mark.usefixtures("operator")

EXAMPLES = ssd.REPO / "examples"


def test_the_env_file_points_kubectl_at_the_test_cluster(cluster: Cluster) -> None:
    env = cluster.state_dir / "env"
    assert env.is_file(), "cluster.sh up writes .cluster/env"
    script = f'source {env} && echo "$KUBECONFIG" && command -v kubectl && kubectl get nodes -o name'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=60).stdout
    kubeconfig, kubectl, *nodes = out.split()
    assert kubeconfig == str(cluster.kubeconfig) and kubectl == str(cluster.bin_dir / "kubectl")
    assert "node/fake-h100-0" in nodes


def test_the_chart_notes_say_the_operator_pod_is_a_fake_here(cluster: Cluster) -> None:
    notes = cluster.helm("get", "notes", RELEASE, "-n", RELEASE_NAMESPACE).stdout
    assert "kwok's fakes" in notes and "source .cluster/env && .venv/bin/starsd operator" in notes
    assert "LoadUnavailable" in notes
    assert "logs deployment/" not in notes  # it has no logs here


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    selector = f"involvedObject.kind=StarSDCluster,involvedObject.name={name}"
    data = json.loads(
        cluster.kubectl("get", "events", "-n", namespace, "--field-selector", selector, "-o", "json").stdout
    )
    return [(e["type"], e["reason"], e["message"]) for e in data["items"]]


def test_create_and_scale_post_normal_events_and_targets_reads_ready_over_desired(
    cluster: Cluster, namespace: str
) -> None:
    ssd.apply(cluster, namespace, ssd.sample("chat"))
    ssd.wait_ready(cluster, namespace, "chat", replicas=6)
    created = wait_until(
        "Created events",
        lambda: [e for e in events(cluster, namespace, "chat") if e[1] == "Created"] or None,
    )
    assert ("Normal", "Created", "created StatefulSet chat-target-h100") in created
    assert ("Normal", "Created", "created Deployment chat-draft") in created

    table = cluster.kubectl("get", ssd.RESOURCE, "chat", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:3] == ["NAME", "READY", "TARGETS"] and row[:3] == ["chat", "True", "6/6"], table

    cluster.kubectl("scale", f"{ssd.RESOURCE}/chat", "--replicas=3", "-n", namespace)
    ssd.wait_ready(cluster, namespace, "chat", replicas=3)
    scaled = wait_until(
        "Scaled events",
        lambda: [e for e in events(cluster, namespace, "chat") if e[1] == "Scaled"] or None,
    )
    assert ("Normal", "Scaled", "scaled StatefulSet chat-target-h100 from 4 to 2 replicas") in scaled
    described = cluster.kubectl("describe", ssd.RESOURCE, "chat", "-n", namespace).stdout
    assert "Events:  <none>" not in described and "Scaled" in described and "Created" in described


def dry_run(cluster: Cluster, namespace: str, manifest: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=manifest, check=False)


def test_the_examples_are_accepted_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    sample = (EXAMPLES / "starsd-cluster.yaml").read_text()
    proc = dry_run(cluster, namespace, sample)
    assert proc.returncode == 0, proc.stderr
    patched = yaml.safe_load(sample)
    patch = yaml.safe_load((EXAMPLES / "models" / "from-claim.yaml").read_text())
    for role in ("draft", "target"):
        patched["spec"][role]["model"] = patch["spec"][role]["model"]
    proc = dry_run(cluster, namespace, yaml.safe_dump(patched))
    assert proc.returncode == 0, proc.stderr
    proc = dry_run(cluster, namespace, (EXAMPLES / "models" / "models-pvc.yaml").read_text())
    assert proc.returncode == 0, proc.stderr
    assert "persistentvolumeclaim/starsd-models created (server dry run)" in proc.stdout
