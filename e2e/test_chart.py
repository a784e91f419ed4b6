"""The chart on a real API server: helm installs it, its ServiceAccount has exactly the operator's
permissions, and the documented CRD upgrade story works."""

from __future__ import annotations

import json
import subprocess

import pytest
from starsd_operator import permissions

from e2e.kube import Cluster
from e2e.operator_process import (
    IMAGE_REGISTRY,
    RELEASE,
    RELEASE_NAMESPACE,
    OperatorProcess,
    chart_path,
    install_chart,
)

SA = f"system:serviceaccount:{RELEASE_NAMESPACE}:{RELEASE}-operator"


def _kubectl_name(group: str, resource: str) -> str:
    """``deployments.apps``, ``pods``, ``starsdclusters.starsd.io/status``: kubectl's RESOURCE.GROUP[/SUB]."""
    name, _, sub = resource.partition("/")
    full = f"{name}.{group}" if group else name
    return f"{full}/{sub}" if sub else full


# Every request the operator makes (starsd_operator.permissions), verb by verb.
ALLOWED = sorted(
    (verb, _kubectl_name(group, resource))
    for (group, resource), verbs in permissions.rules(clusterwide=True).items()  # the e2e chart is cluster-wide
    for verb in verbs
)
DENIED = [
    # Verbs the operator never uses on what it does touch.
    ("get", "starsdclusters.starsd.io"),
    ("update", "starsdclusters.starsd.io/scale"),
    ("delete", "deployments.apps"),  # the draft Deployment is scaled and patched, never deleted
    ("delete", "networkpolicies.networking.k8s.io"),
    ("get", "pods"),  # watched, never read one by one
    ("patch", "events"),
    ("get", "namespaces"),
    ("create", "starsdclusters.starsd.io"),
    ("delete", "starsdclusters.starsd.io"),
    ("list", "secrets"),  # the Secret of spec.auth is read by name (get), never listed or watched
    ("watch", "secrets"),
    ("list", "configmaps"),
    ("delete", "pods"),
    ("create", "pods"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "nodes"),
]


def can(cluster: Cluster, verb: str, resource: str) -> str:
    """`kubectl auth can-i` as the operator's ServiceAccount; RESOURCE/SUBRESOURCE is split for kubectl."""
    resource, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    proc = cluster.kubectl("auth", "can-i", verb, resource, *extra, "--as", SA, "-A", check=False)
    return proc.stdout.strip()


@pytest.mark.parametrize(("verb", "resource"), ALLOWED)
def test_operator_service_account_may_do_what_the_operator_needs(
    cluster: Cluster, operator: OperatorProcess, verb: str, resource: str
) -> None:
    assert can(cluster, verb, resource) == "yes"


@pytest.mark.parametrize(("verb", "resource"), DENIED)
def test_operator_service_account_may_do_nothing_else(
    cluster: Cluster, operator: OperatorProcess, verb: str, resource: str
) -> None:
    assert can(cluster, verb, resource) == "no"


def test_chart_release_is_deployed_with_its_crd(cluster: Cluster, operator: OperatorProcess) -> None:
    releases = json.loads(cluster.helm("list", "-n", RELEASE_NAMESPACE, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [(RELEASE, "deployed")]
    crd = cluster.get("crd", "starsdclusters.starsd.io")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"
    deployment = cluster.get("deployment", f"{RELEASE}-operator", RELEASE_NAMESPACE)
    assert deployment["status"].get("readyReplicas") == 2  # peered: one active, one on standby
    # The peering object the replicas elect the active one with, and their disruption budget.
    assert cluster.get("clusterkopfpeerings.kopf.dev", f"{RELEASE}-operator")
    assert cluster.get("pdb", f"{RELEASE}-operator", RELEASE_NAMESPACE)["spec"]["minAvailable"] == 1


def test_documented_crd_upgrade_restores_the_chart_crd(cluster: Cluster, operator: OperatorProcess) -> None:
    """charts/starsd/README.md: `helm show crds CHART | kubectl apply --server-side --force-conflicts -f -`
    before `helm upgrade`. An old CRD is simulated by removing the printer columns of the live one."""
    cluster.kubectl(
        "patch",
        "crd",
        "starsdclusters.starsd.io",
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/spec/versions/0/additionalPrinterColumns"}]',
    )
    assert "additionalPrinterColumns" not in cluster.get("crd", "starsdclusters.starsd.io")["spec"]["versions"][0]

    shown = cluster.helm("show", "crds", chart_path(cluster)).stdout
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=shown)
    install_chart(cluster)  # helm upgrade --install

    columns = cluster.get("crd", "starsdclusters.starsd.io")["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns][:2] == ["Ready", "Targets"]
    history = json.loads(cluster.helm("history", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json").stdout)
    assert history[-1]["status"] == "deployed" and len(history) >= 2


def test_helm_lint_passes_against_the_built_helm(cluster: Cluster) -> None:
    proc = subprocess.run(
        [str(cluster.bin_dir / "helm"), "lint", "--strict", str(cluster.repo / "charts" / "starsd")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", ["sample.yaml", "custom-pools.yaml"])
def test_chart_sample_cluster_is_accepted_by_the_api_server(
    cluster: Cluster, operator: OperatorProcess, namespace: str, values: str
) -> None:
    """The sample the chart renders (cluster.enabled) passes the real CRD's schema and CEL rules."""
    rendered = cluster.helm(
        "template",
        RELEASE,
        chart_path(cluster),
        "--namespace",
        namespace,
        "-f",
        str(cluster.repo / "tests" / "chart" / "values" / values),
        "--set",
        f"image.registry={IMAGE_REGISTRY}",
        "--show-only",
        "templates/starsdcluster.yaml",
    ).stdout
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=rendered, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "created (server dry run)" in proc.stdout
