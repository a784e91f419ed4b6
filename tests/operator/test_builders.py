"""The child resources, as the plain dicts the operator applies: names, labels, selectors, owner references,
placement, resources, probes, security context, commands and environment."""

from __future__ import annotations

from typing import Any

import pytest
from starsd_operator import children, draft, naming, network, targets
from starsd_operator import constants as c
from starsd_operator.modelsource import MODEL_ROOT
from starsd_operator.podspec import Images
from starsd_operator.spec import ClusterSpec, SpecError, parse

from starsd import defaults as d

from . import factories as f

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")
GPU = {"limits": {"nvidia.com/gpu": "1"}}
TAINT = [{"key": "starsd.io/pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}]


def cluster_spec(**overrides: Any) -> ClusterSpec:
    return parse(f.spec(**overrides))


def placed_spec() -> ClusterSpec:
    return cluster_spec(
        draft={
            "model": {"path": "/models/draft"},
            "resources": GPU,
            "nodeSelector": {"starsd.io/pool": "l4"},
            "tolerations": TAINT,
        },
        pools=[
            {
                "name": "h100",
                "weight": 2,
                "nodeSelector": {"starsd.io/pool": "h100"},
                "tolerations": TAINT,
                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "80Gi"}},
            },
            {"name": "l4", "weight": 1, "nodeSelector": {"starsd.io/pool": "l4"}},
        ],
    )


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def only_container(obj: dict[str, Any]) -> dict[str, Any]:
    [container] = pod_spec(obj)["containers"]
    return container


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_every_child_is_owned_labelled_and_in_the_clusters_namespace() -> None:
    for obj in children.desired(f.OWNER, placed_spec(), IMAGES):
        meta = obj["metadata"]
        assert meta["namespace"] == "ml"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "starsd.io/v1alpha1",
                "kind": "StarSDCluster",
                "name": "chat",
                "uid": f.OWNER.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = meta["labels"]
        assert labels[c.LABEL_NAME] == "starsd"
        assert labels[c.LABEL_INSTANCE] == "chat"
        assert labels[c.LABEL_MANAGED_BY] == "starsd-operator"
        assert labels[c.LABEL_COMPONENT] in ("draft", "target")


def test_the_children_of_a_two_pool_cluster() -> None:
    objs = children.desired(f.OWNER, placed_spec(), IMAGES)
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("Service", "chat-draft"),
        ("Service", "chat-draft-pods"),
        ("NetworkPolicy", "chat-draft"),
        ("Deployment", "chat-draft"),
        ("Service", "chat"),
        ("NetworkPolicy", "chat-target"),
        ("PodDisruptionBudget", "chat-draft"),
        ("Service", "chat-target-h100"),
        ("StatefulSet", "chat-target-h100"),
        ("PodDisruptionBudget", "chat-target-h100"),
        ("Service", "chat-target-l4"),
        ("StatefulSet", "chat-target-l4"),
        ("PodDisruptionBudget", "chat-target-l4"),
    ]


def test_workload_selectors_match_their_pod_labels() -> None:
    for obj in children.desired(f.OWNER, placed_spec(), IMAGES):
        if obj["kind"] in ("Deployment", "StatefulSet"):
            selector = obj["spec"]["selector"]["matchLabels"]
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= pod_labels.items()
            assert pod_labels == obj["metadata"]["labels"]


def test_target_pods_carry_their_pool_and_the_status_selector_matches_them() -> None:
    sts = targets.statefulset(f.OWNER, placed_spec(), placed_spec().pools[0], 2, IMAGES)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels[c.LABEL_POOL] == "h100" and labels[c.LABEL_COMPONENT] == "target"
    selector = dict(part.split("=") for part in naming.status_selector(f.OWNER).split(","))
    assert selector == {c.LABEL_INSTANCE: "chat", c.LABEL_COMPONENT: "target"}
    assert selector.items() <= labels.items()
    assert naming.status_selector(f.OWNER) == "app.kubernetes.io/instance=chat,app.kubernetes.io/component=target"


def test_the_draft_deployment_surges_a_new_draft_in_before_the_old_one_leaves() -> None:
    dep = draft.deployment(f.OWNER, placed_spec(), IMAGES)
    assert dep["kind"] == "Deployment" and dep["metadata"]["name"] == "chat-draft"
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "serviceName" not in dep["spec"] and "updateStrategy" not in dep["spec"]
    container = only_container(dep)
    assert container["image"] == "reg/draft:1"
    assert container["command"] == [
        "starsd",
        "draft",
        "--model",
        "/models/draft",
        "--port",
        "50051",
        "--metrics-port",
        "9090",
        "--device",
        "cuda",
        "--dtype",
        "auto",
        "--max-batch",
        "32",
        "--schedule",
        "fifo",
    ]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": 50051, "metrics": 9090}
    assert container["resources"] == {**GPU, "requests": {"cpu": "1", "memory": "4Gi"}}  # the defaults fill in
    spec = pod_spec(dep)
    assert spec["nodeSelector"] == {"starsd.io/pool": "l4"}
    assert spec["tolerations"] == TAINT


def test_the_target_statefulset_of_a_pool() -> None:
    spec = placed_spec()
    sts = targets.statefulset(f.OWNER, spec, spec.pools[0], 5, IMAGES)
    assert sts["metadata"]["name"] == "chat-target-h100"
    assert sts["spec"]["replicas"] == 5
    assert sts["spec"]["serviceName"] == "chat-target-h100"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    container = only_container(sts)
    assert container["image"] == "reg/target:1"
    assert container["command"] == [
        "starsd",
        "target",
        "--model",
        "/models/target",
        "--drafts-from",
        "dns:chat-draft-pods.ml.svc:50051",
        "--port",
        "8000",
        "--gamma",
        "4",
        "--device",
        "cuda",
        "--dtype",
        "auto",
        "--max-num-seqs",
        "64",
        "--max-prefill-tokens",
        "512",
        "--id",
        "$(POD_NAME)",
    ]
    # memory is named by a limit (Kubernetes requests as much), so only cpu gets the default request
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1", "memory": "80Gi"}, "requests": {"cpu": "2"}}
    assert env(container)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env(container)["STARSD_POOL"] == "h100"
    assert pod_spec(sts)["nodeSelector"] == {"starsd.io/pool": "h100"}
    assert pod_spec(sts)["tolerations"] == TAINT


def test_a_pool_without_placement_has_no_selector_tolerations_or_resources() -> None:
    spec = placed_spec()
    sts = targets.statefulset(f.OWNER, spec, spec.pools[1], 1, IMAGES)
    assert "nodeSelector" in pod_spec(sts)
    assert "tolerations" not in pod_spec(sts)
    assert only_container(sts)["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}
    bare = cluster_spec()
    sts = targets.statefulset(f.OWNER, bare, bare.pools[1], 1, IMAGES)
    assert "nodeSelector" not in pod_spec(sts)


def test_spec_images_override_the_defaults() -> None:
    spec = cluster_spec(
        draft={"model": {"path": "/d"}, "image": "mine/draft:2"},
        target={"model": {"path": "/t"}, "image": "mine/target:2"},
    )
    assert only_container(draft.deployment(f.OWNER, spec, IMAGES))["image"] == "mine/draft:2"
    assert only_container(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES))["image"] == "mine/target:2"


def test_default_images_come_from_the_environment() -> None:
    assert Images.from_env({}) == Images("starsd/draft:0.1.0", "starsd/target:0.1.0")
    assert Images.from_env({"STARSD_DRAFT_IMAGE": "a:1", "STARSD_TARGET_IMAGE": "b:2"}) == Images("a:1", "b:2")


@pytest.mark.parametrize("component", ["draft", "target"])
def test_probes(component: str) -> None:
    spec = placed_spec()
    obj = (
        draft.deployment(f.OWNER, spec, IMAGES)
        if component == "draft"
        else targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)
    )
    container = only_container(obj)
    port = "metrics" if component == "draft" else "http"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert port in {p["name"] for p in container["ports"]}


@pytest.mark.parametrize("component", ["draft", "target"])
def test_pods_run_unprivileged_with_a_read_only_root(component: str) -> None:
    objs = children.desired(f.OWNER, placed_spec(), IMAGES)
    workloads = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    [obj] = [o for o in workloads if o["metadata"]["labels"][c.LABEL_COMPONENT] == component][:1]
    pod = pod_spec(obj)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == c.RUN_AS_USER
    assert pod["automountServiceAccountToken"] is False
    sc = only_container(obj)["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    # The read-only root needs a writable scratch directory, and HOME points there.
    assert {"name": "tmp", "mountPath": "/tmp"} in only_container(obj)["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
    assert env(only_container(obj))["HOME"] == "/tmp"


def test_termination_messages_reach_the_status() -> None:
    container = only_container(draft.deployment(f.OWNER, placed_spec(), IMAGES))
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_a_model_on_a_claim_is_mounted_read_only_where_the_process_loads_it() -> None:
    spec = cluster_spec(target={"model": {"pvc": {"claimName": "weights", "subPath": "t"}}})
    sts = targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod_spec(sts)[
        "volumes"
    ]
    assert {"name": "model", "mountPath": MODEL_ROOT, "readOnly": True, "subPath": "t"} in only_container(sts)[
        "volumeMounts"
    ]
    command = only_container(sts)["command"]
    assert command[command.index("--model") + 1] == MODEL_ROOT
    assert "initContainers" not in pod_spec(sts)


def test_a_writable_claim_is_mounted_writable() -> None:
    spec = cluster_spec(draft={"model": {"pvc": {"claimName": "w", "readOnly": False}}})
    dep = draft.deployment(f.OWNER, spec, IMAGES)
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "w", "readOnly": False}} in pod_spec(dep)["volumes"]
    assert {"name": "model", "mountPath": MODEL_ROOT, "readOnly": False} in only_container(dep)["volumeMounts"]


def test_a_model_in_the_image_mounts_nothing() -> None:
    dep = draft.deployment(f.OWNER, cluster_spec(), IMAGES)
    assert [v["name"] for v in pod_spec(dep)["volumes"]] == ["tmp"]


def test_gamma_reaches_the_target_command() -> None:
    spec = cluster_spec(target={"model": {"path": "/t"}, "gamma": 7})
    command = only_container(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES))["command"]
    assert command[command.index("--gamma") + 1] == "7"


def test_precision_and_batching_reach_the_commands() -> None:
    spec = cluster_spec(
        draft={"model": {"path": "/d"}, "dtype": "float16", "maxBatch": 16, "schedule": "fair"},
        target={"model": {"path": "/t"}, "dtype": "bfloat16", "maxNumSeqs": 128, "kvCacheTokens": 90000},
    )
    draft_command = only_container(draft.deployment(f.OWNER, spec, IMAGES))["command"]
    target_command = only_container(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES))["command"]

    def flag(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    assert [flag(draft_command, n) for n in ("--dtype", "--max-batch", "--schedule", "--device")] == [
        "float16",
        "16",
        "fair",
        "cpu",
    ]
    assert [flag(target_command, n) for n in ("--dtype", "--max-num-seqs", "--kv-cache-tokens", "--device")] == [
        "bfloat16",
        "128",
        "90000",
        "cpu",
    ]


def device(obj: dict[str, Any]) -> str:
    command = only_container(obj)["command"]
    return str(command[command.index("--device") + 1])


def test_a_role_that_asks_for_a_gpu_runs_on_cuda_and_a_cpu_only_role_on_the_cpu() -> None:
    spec = placed_spec()  # the draft and pool h100 ask for a GPU, pool l4 does not
    assert device(draft.deployment(f.OWNER, spec, IMAGES)) == "cuda"
    assert device(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)) == "cuda"
    assert device(targets.statefulset(f.OWNER, spec, spec.pools[1], 1, IMAGES)) == "cpu"
    bare = cluster_spec()
    assert device(draft.deployment(f.OWNER, bare, IMAGES)) == "cpu"


def test_a_gpu_asked_for_in_a_pod_template_counts_as_asked_for() -> None:
    gpu_template = {"spec": {"containers": [{"name": c.COMPONENT_TARGET, "resources": GPU}]}}
    spec = cluster_spec(pools=[{"name": "a100", "podTemplate": gpu_template}])
    assert device(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)) == "cuda"
    zero = {"spec": {"containers": [{"name": c.COMPONENT_DRAFT, "resources": {"limits": {"nvidia.com/gpu": "0"}}}]}}
    spec = cluster_spec(draft={"model": {"path": "/d"}, "resources": GPU, "podTemplate": zero})
    assert device(draft.deployment(f.OWNER, spec, IMAGES)) == "cpu"


def test_pods_know_their_node_from_the_downward_api() -> None:
    spec = placed_spec()
    for obj in (draft.deployment(f.OWNER, spec, IMAGES), targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)):
        container = only_container(obj)
        assert env(container)["STARSD_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert container["terminationMessagePath"] == "/dev/termination-log"
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_every_role_requests_cpu_and_memory_so_no_pod_is_best_effort() -> None:
    bare = cluster_spec()
    drafts = only_container(draft.deployment(f.OWNER, bare, IMAGES))["resources"]
    pool = only_container(targets.statefulset(f.OWNER, bare, bare.pools[0], 1, IMAGES))["resources"]
    assert drafts == {"requests": {"cpu": d.DRAFT_CPU_REQUEST, "memory": d.DRAFT_MEMORY_REQUEST}}
    assert pool == {"requests": {"cpu": d.TARGET_CPU_REQUEST, "memory": d.TARGET_MEMORY_REQUEST}}


def test_given_requests_or_limits_are_kept_and_a_default_never_exceeds_a_limit() -> None:
    mine = {"requests": {"cpu": "500m"}, "limits": {"memory": "2Gi"}}
    spec = cluster_spec(pools=[{"name": "small", "resources": mine}])
    got = only_container(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES))["resources"]
    assert got == mine  # memory is named by its limit: Kubernetes requests as much
    small = {"spec": {"containers": [{"name": c.COMPONENT_TARGET, "resources": {"limits": {"memory": "1Gi"}}}]}}
    spec = cluster_spec(pools=[{"name": "tiny", "podTemplate": small}])
    got = only_container(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES))["resources"]
    assert got == {"limits": {"memory": "1Gi"}, "requests": {"cpu": d.TARGET_CPU_REQUEST}}


def empty_dirs(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["emptyDir"] for v in pod_spec(obj)["volumes"] if "emptyDir" in v}


def test_every_empty_dir_has_a_size_limit_and_the_spec_sets_them() -> None:
    downloaded = {"uri": "hf://org/model@main"}
    spec = cluster_spec(
        draft={"model": downloaded, "resources": GPU},
        target={"model": downloaded},
        pools=[{"name": "h100", "resources": GPU}],
    )
    objs = [draft.deployment(f.OWNER, spec, IMAGES), targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)]
    for obj in objs:
        dirs = empty_dirs(obj)
        assert set(dirs) == {"tmp", "model", "dshm"}
        assert {name: v["sizeLimit"] for name, v in dirs.items()} == {
            "tmp": d.TMP_SIZE_LIMIT,
            "model": d.MODEL_SIZE_LIMIT,
            "dshm": d.SHM_SIZE_LIMIT,
        }
    sizes = {"tmp": "3Gi", "shm": "16Gi", "model": "500Gi"}
    spec = cluster_spec(
        draft={"model": downloaded, "resources": GPU, "sizeLimits": sizes},
        target={"model": downloaded, "sizeLimits": {"model": "40Gi"}},
        pools=[{"name": "h100", "resources": GPU}],
    )
    dirs = empty_dirs(draft.deployment(f.OWNER, spec, IMAGES))
    assert [dirs[n]["sizeLimit"] for n in ("tmp", "dshm", "model")] == ["3Gi", "16Gi", "500Gi"]
    dirs = empty_dirs(targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES))
    assert [dirs[n]["sizeLimit"] for n in ("tmp", "dshm", "model")] == [d.TMP_SIZE_LIMIT, d.SHM_SIZE_LIMIT, "40Gi"]


@pytest.mark.parametrize("bad", ["", "0", "-1Gi", "lots", 5])
def test_a_size_limit_that_is_no_positive_quantity_is_a_spec_error(bad: object) -> None:
    with pytest.raises(SpecError, match=r"spec\.target\.sizeLimits\.tmp"):
        cluster_spec(target={"model": {"path": "/t"}, "sizeLimits": {"tmp": bad}})


def test_an_unknown_dtype_is_a_spec_error() -> None:
    from starsd_operator.spec import SpecError

    with pytest.raises(SpecError, match="dtype"):
        cluster_spec(target={"model": {"path": "/t"}, "dtype": "int3"})


def test_services() -> None:
    svc = draft.service(f.OWNER)
    assert svc["spec"]["selector"] == naming.selector_labels(f.OWNER, "draft")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 50051, "metrics": 9090}
    headless = targets.headless_service(f.OWNER, cluster_spec().pools[0])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"][c.LABEL_POOL] == "h100"
    client = targets.client_service(f.OWNER)
    assert client["metadata"]["name"] == "chat"
    assert client["spec"]["selector"] == naming.selector_labels(f.OWNER, "target")
    assert c.LABEL_POOL not in client["spec"]["selector"]
    assert [p["port"] for p in client["spec"]["ports"]] == [8000]


def test_only_this_clusters_targets_reach_the_draft_grpc_port() -> None:
    policy = network.draft_policy(f.OWNER)["spec"]
    assert policy["podSelector"] == {"matchLabels": naming.selector_labels(f.OWNER, "draft")}
    assert policy["policyTypes"] == ["Ingress"]
    grpc, metrics = policy["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 50051}]
    assert grpc["from"] == [{"podSelector": {"matchLabels": naming.selector_labels(f.OWNER, "target")}}]
    assert grpc["from"][0]["podSelector"]["matchLabels"][c.LABEL_INSTANCE] == "chat"
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9090}]}


def test_replicas_are_split_across_the_pools_by_weight() -> None:
    objs = children.desired(f.OWNER, cluster_spec(targets={"replicas": 6}), IMAGES)
    replicas = {
        o["metadata"]["name"]: o["spec"]["replicas"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")
    }
    assert replicas == {"chat-draft": 1, "chat-target-h100": 4, "chat-target-l4": 2}


def test_long_names_are_shortened_stably_within_kubernetes_limits() -> None:
    owner = naming.Owner(name="a" * 63, namespace="ml", uid="u")
    name = naming.pool_name(owner, "p" * 24)
    assert len(name) <= naming.STATEFULSET_NAME_LIMIT
    assert name == naming.pool_name(owner, "p" * 24)
    assert name != naming.pool_name(owner, "q" * 24)
    assert len(naming.draft_name(owner)) <= 63
    # The draft StatefulSet of older operators (replaced) was named within a StatefulSet's limit.
    assert len(naming.draft_statefulset_name(owner)) <= naming.STATEFULSET_NAME_LIMIT < len(naming.draft_name(owner))
    assert len(naming.draft_headless_name(owner)) <= 63
    assert naming.drafts_source(owner) == f"dns:{naming.draft_headless_name(owner)}.ml.svc:50051"
    assert naming.child_name("chat", "draft") == "chat-draft"


def test_the_builders_are_pure() -> None:
    spec = placed_spec()
    assert children.desired(f.OWNER, spec, IMAGES) == children.desired(f.OWNER, spec, IMAGES)
    first = children.desired(f.OWNER, spec, IMAGES)
    [drafts] = [o for o in first if (o["kind"], o["metadata"]["name"]) == ("Deployment", "chat-draft")]
    pod_spec(drafts)["nodeSelector"]["x"] = "y"
    assert "x" not in spec.draft.placement.node_selector


def drafts_from(obj: dict[str, Any]) -> str:
    command = only_container(obj)["command"]
    assert "--draft" not in command
    return str(command[command.index("--drafts-from") + 1])


@pytest.mark.parametrize("drafts", [1, 3])
def test_the_drafts_are_a_deployment_listed_by_a_headless_service_that_every_target_resolves(drafts: int) -> None:
    spec = cluster_spec(draft={"model": {"path": "/d"}, "replicas": drafts}, targets={"replicas": 9})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in children.desired(f.OWNER, spec, IMAGES)}
    assert ("StatefulSet", "chat-draft") not in objs
    dep = objs[("Deployment", "chat-draft")]
    assert dep["spec"]["replicas"] == drafts
    headless = objs[("Service", "chat-draft-pods")]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is False
    assert headless["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {"grpc": 50051, "metrics": 9090}
    # The one-draft address stays: a ClusterIP Service over any ready draft pod.
    clusterip = objs[("Service", "chat-draft")]
    assert clusterip["spec"]["type"] == "ClusterIP" and clusterip["spec"]["selector"] == headless["spec"]["selector"]
    for pool in ("h100", "l4"):
        assert drafts_from(objs[("StatefulSet", f"chat-target-{pool}")]) == "dns:chat-draft-pods.ml.svc:50051"


def test_a_new_draft_count_changes_no_target_template_so_no_target_restarts() -> None:
    from starsd_operator import rollout

    def target_set(drafts: int) -> dict[str, Any]:
        spec = cluster_spec(draft={"model": {"path": "/d"}, "replicas": drafts})
        return targets.statefulset(f.OWNER, spec, spec.pools[0], 2, IMAGES)

    for drafts in (2, 3, 4, 32):
        assert target_set(drafts) == target_set(1)
        assert (
            target_set(drafts)["metadata"]["annotations"][rollout.ANNOTATION_TEMPLATE_HASH]
            == target_set(1)["metadata"]["annotations"][rollout.ANNOTATION_TEMPLATE_HASH]
        )


def test_the_draft_pod_template_and_placement_apply_to_every_draft_pod() -> None:
    spec = cluster_spec(
        draft={
            "model": {"uri": "hf://org/draft"},
            "replicas": 3,
            "nodeSelector": {"starsd.io/pool": "l4"},
            "podTemplate": {"spec": {"priorityClassName": "drafts"}},
        }
    )
    pod = pod_spec(draft.deployment(f.OWNER, spec, IMAGES))
    assert pod["priorityClassName"] == "drafts"
    assert pod["nodeSelector"] == {"starsd.io/pool": "l4"}
    assert [i["name"] for i in pod["initContainers"]] == ["fetch-model"]
