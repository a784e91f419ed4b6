"""Rendered templates over several values files: labels, names, security contexts, RBAC, images, sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starsd_operator import permissions

from .conftest import Rendered

VALUES_CASES = {
    "defaults": (),
    "sample": ("sample.yaml",),
    "servicemonitor": ("servicemonitor.yaml",),
    "custom-pools": ("custom-pools.yaml",),
    "auth": ("auth.yaml",),
}
RECOMMENDED_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
}

Render = Callable[..., Rendered]


@pytest.fixture(params=list(VALUES_CASES), ids=list(VALUES_CASES))
def rendered(request: pytest.FixtureRequest, render: Render) -> Rendered:
    return render(*VALUES_CASES[request.param])


def pod_specs(docs: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every pod the chart renders, directly or through a workload's template."""
    specs = []
    for d in docs:
        if d["kind"] == "Pod":
            specs.append((d["metadata"]["name"], d["spec"]))
        elif d["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
            specs.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
    return specs


def test_every_resource_has_the_recommended_labels(rendered: Rendered) -> None:
    for d in rendered:
        labels = d["metadata"].get("labels", {})
        assert set(labels) >= RECOMMENDED_LABELS, f"{d['kind']}/{d['metadata']['name']} lacks labels"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "rel"


def test_names_are_cut_to_63_characters(render: Render) -> None:
    long_release = "a-release-name-that-is-as-long-as-helm-allows-53-char"
    assert len(long_release) == 53
    docs = render("sample.yaml", release=long_release)
    for d in docs:
        name = d["metadata"]["name"]
        assert len(name) <= 63, name
        assert not name.endswith("-"), name
    deployment = docs.one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(len(str(v)) <= 63 for v in labels.values())


def test_deployment_selector_matches_its_pod_labels(rendered: Rendered) -> None:
    deployment = rendered.one("Deployment", "-operator")
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert "app.kubernetes.io/version" not in selector, "the selector must not change on upgrade"


def test_operator_runs_two_peered_replicas_with_a_disruption_budget(rendered: Rendered) -> None:
    spec = rendered.one("Deployment", "-operator")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    name = rendered.one("Deployment", "-operator")["metadata"]["name"]
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert f"--peering={name}" in args
    namespaced = bool(rendered.of_kind("Role"))
    peering = rendered.one("KopfPeering" if namespaced else "ClusterKopfPeering")
    assert peering["metadata"]["name"] == name and peering["apiVersion"] == "kopf.dev/v1"
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_one_operator_replica_runs_standalone_replaced_with_recreate(render: Render) -> None:
    docs = render(sets=("operator.replicas=1",))
    spec = docs.one("Deployment", "-operator")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert not [a for a in spec["template"]["spec"]["containers"][0]["args"] if a.startswith("--peering")]
    assert docs.of_kind("PodDisruptionBudget") == [] and docs.of_kind("ClusterKopfPeering") == []


def test_every_pod_runs_non_root_with_a_read_only_root_filesystem(rendered: Rendered) -> None:
    specs = pod_specs(rendered)
    assert specs, "no pod rendered"
    for name, spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert "limits" in c["resources"] and "memory" in c["resources"]["limits"], (name, c["name"])


def test_operator_probes_use_the_liveness_endpoint_it_serves(rendered: Rendered) -> None:
    container = rendered.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    liveness_arg = next(a for a in container["args"] if a.startswith("--liveness="))
    port = container["ports"][0]
    assert liveness_arg == f"--liveness=http://0.0.0.0:{port['containerPort']}/healthz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}


# The permissions the operator uses (what it reads, writes and watches); anything else is a regression.


def granted_permissions(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def role_kind(docs: Rendered) -> str:
    """ClusterRole, or Role when the values set operator.watchNamespace."""
    return "Role" if docs.of_kind("Role") else "ClusterRole"


def test_cluster_role_grants_exactly_what_the_operator_uses_and_no_wildcard(rendered: Rendered) -> None:
    kind = role_kind(rendered)
    role = rendered.one(kind)
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {rule}"
    expected = {key: set(verbs) for key, verbs in permissions.rules(clusterwide=kind == "ClusterRole").items()}
    assert granted_permissions(role) == expected


def test_cluster_role_binding_binds_the_operator_service_account(rendered: Rendered) -> None:
    kind = role_kind(rendered)
    binding = rendered.one(f"{kind}Binding")
    account = rendered.one("ServiceAccount")
    pod = rendered.one("Deployment", "-operator")["spec"]["template"]["spec"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": kind,
        "name": rendered.one(kind)["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "starsd-system"}
    ]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def operator_env(docs: Rendered) -> dict[str, Any]:
    container = docs.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_operator_gets_the_draft_and_target_images(render: Render) -> None:
    assert operator_env(render()) | {"POD_NAMESPACE": None} == {
        "STARSD_DRAFT_IMAGE": "registry.example/starsd/draft:0.1.0",
        "STARSD_TARGET_IMAGE": "registry.example/starsd/target:0.1.0",
        "POD_NAMESPACE": None,
    }
    custom = operator_env(render("custom-pools.yaml"))  # per-image repository and tag under the one registry
    assert custom["STARSD_DRAFT_IMAGE"] == "registry.example/ml/draft:0.1.0-cpu"
    assert custom["STARSD_TARGET_IMAGE"] == "registry.example/starsd/target:0.2.0"


def test_operator_image_and_arguments(render: Render) -> None:
    container = render().one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/starsd/operator:0.1.0"
    assert container["args"][:2] == ["--log-level=INFO", "operator"]
    assert not any(a.startswith("--namespace") for a in container["args"])
    custom = render("custom-pools.yaml").one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=inference" in custom["args"]
    assert "--log-level=DEBUG" in custom["args"]


def test_sample_cluster_is_off_by_default_and_so_is_the_test_pod(render: Render) -> None:
    docs = render()
    assert docs.of_kind("StarSDCluster") == []
    assert docs.of_kind("Pod") == []
    assert docs.of_kind("ServiceMonitor") == []


def test_sample_cluster_renders_the_values(render: Render) -> None:
    sample = render("sample.yaml").one("StarSDCluster")
    assert sample["apiVersion"] == "starsd.io/v1alpha1"
    assert sample["metadata"]["name"] == "chat"
    spec = sample["spec"]
    assert spec["draft"]["model"] == {"path": "/models/draft"}
    assert spec["target"]["model"] == {"path": "/models/target"} and spec["target"]["gamma"] == 4
    assert [p["name"] for p in spec["pools"]] == ["h100", "l4"]
    assert spec["pools"][0]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["pools"][0]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_custom_pools_reach_the_sample_cluster(render: Render) -> None:
    spec = render("custom-pools.yaml").one("StarSDCluster")["spec"]
    assert [(p["name"], p["weight"]) for p in spec["pools"]] == [("h100", 4), ("a100", 2), ("l4", 1)]
    assert spec["pools"][1]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["targets"]["replicas"] == 12
    assert spec["target"]["gamma"] == 6
    assert spec["autoscaling"]["enabled"] is False


def test_test_pod_sends_a_completion_to_the_client_service(render: Render) -> None:
    pod = render("sample.yaml").one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "registry.example/starsd/target:0.1.0"
    assert container["args"][1] == "http://chat.starsd-system.svc:8000/v1/completions"
    assert "/v1/completions" in container["args"][1] and "urlopen" in container["args"][0]


def test_the_sample_asks_for_a_key_and_the_test_pod_sends_it_from_the_secret(render: Render) -> None:
    docs = render("auth.yaml")
    spec = docs.one("StarSDCluster")["spec"]
    assert spec["auth"] == {"apiKeySecretRef": {"name": "chat-keys", "key": "api-key"}}
    pod = docs.one("Pod")
    (container,) = pod["spec"]["containers"]
    assert container["env"] == [
        {"name": "STARSD_API_KEY", "valueFrom": {"secretKeyRef": {"name": "chat-keys", "key": "api-key"}}}
    ]
    assert "Authorization" in container["args"][0]
    # The listed clients, and the test pod itself, may reach the targets.
    test_peer = {"podSelector": {"matchLabels": {k: pod["metadata"]["labels"][k] for k in TEST_POD_KEYS}}}
    assert spec["network"]["clients"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}},
        {"podSelector": {"matchLabels": {"app": "gateway"}}},
        test_peer,
    ]


TEST_POD_KEYS = ("app.kubernetes.io/instance", "app.kubernetes.io/component")


def test_without_auth_the_sample_asks_no_key_and_lets_its_namespace_in(render: Render) -> None:
    docs = render("sample.yaml")
    spec = docs.one("StarSDCluster")["spec"]
    assert "auth" not in spec and "network" not in spec
    assert "env" not in docs.one("Pod")["spec"]["containers"][0]


def test_tests_url_takes_its_own_key_secret(render: Render) -> None:
    sets = ("tests.url=http://elsewhere:8000/v1/completions", "tests.apiKeySecretRef.name=other-keys")
    (container,) = render(sets=sets).one("Pod")["spec"]["containers"]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "other-keys", "key": "api-key"}


def test_service_monitors_scrape_each_draft_and_target_pod_once(render: Render) -> None:
    docs = render("servicemonitor.yaml")
    draft = docs.one("ServiceMonitor", "-draft")
    target = docs.one("ServiceMonitor", "-target")
    for monitor in (draft, target):
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        assert monitor["spec"]["namespaceSelector"] == {"any": True}
        assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "starsd-operator"
    assert draft["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "draft"
    assert draft["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    # Only the headless Services carry the scrape label: the client Service (and the draft's ClusterIP one)
    # would scrape each pod twice (tests/chart/test_chart_agrees_with_operator.py counts them).
    assert target["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "target"
    assert target["spec"]["selector"]["matchLabels"]["starsd.io/scrape"] == "true"
    assert draft["spec"]["selector"]["matchLabels"]["starsd.io/scrape"] == "true"
    assert target["spec"]["endpoints"][0]["port"] == "http"
    operator = docs.one("ServiceMonitor", "-operator")
    assert operator["spec"]["endpoints"][0]["port"] == "metrics"
    assert operator["spec"]["namespaceSelector"] == {"matchNames": ["starsd-system"]}


def test_service_monitors_follow_the_watched_namespace(render: Render) -> None:
    docs = render("custom-pools.yaml", sets=("serviceMonitor.enabled=true",))
    for monitor in docs.of_kind("ServiceMonitor"):
        if monitor["metadata"]["name"].endswith("-operator"):  # the operator's own pods: the release's namespace
            assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["starsd-system"]}
            continue
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}


def test_with_a_watch_namespace_the_operator_gets_a_role_in_that_namespace_only(render: Render) -> None:
    docs = render(sets=("operator.watchNamespace=ml",))
    assert docs.of_kind("ClusterRole") == [] and docs.of_kind("ClusterRoleBinding") == []
    role, binding = docs.one("Role"), docs.one("RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ml"
    expected = {key: set(verbs) for key, verbs in permissions.rules(clusterwide=False).items()}
    assert granted_permissions(role) == expected
    assert ("apiextensions.k8s.io", "customresourcedefinitions") not in expected
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"][0]["namespace"] == "starsd-system"


def test_every_kind_the_operator_touches_is_in_its_permissions() -> None:
    from starsd_operator import kube

    plural = {
        "Deployment": ("apps", "deployments"),
        "StatefulSet": ("apps", "statefulsets"),
        "Service": ("", "services"),
        "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
        "Pod": ("", "pods"),
        "HorizontalPodAutoscaler": ("autoscaling", "horizontalpodautoscalers"),
        "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
        "Secret": ("", "secrets"),
    }
    granted = permissions.rules(clusterwide=False)
    assert set(kube._KINDS) == set(plural)
    for kind in kube._KINDS:
        # Secrets are read one by name (spec.auth), never listed; everything else is listed by label.
        assert ("get" if kind == "Secret" else "list") in granted[plural[kind]], kind
    assert granted[plural["Secret"]] == {"get"}
