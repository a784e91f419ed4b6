"""A pool with ``engine: vllm``: its StatefulSet runs ``vllm serve`` with StarSD's proposer in a pod that is a
StarSD pool's in every other respect (port, labels, placement, resources, volumes), the spec parser refuses what
the CRD's CEL rules refuse, and a StarSD pool renders as it always did."""

from __future__ import annotations

import copy
import importlib
import json
from typing import Any

import pytest
import yaml
from starsd_operator import apikey, children, naming, network, targets
from starsd_operator import constants as c
from starsd_operator.modelsource import MODEL_ROOT
from starsd_operator.podspec import Images
from starsd_operator.spec import VLLM_OPERATOR_FLAGS, ClusterSpec, SpecError, parse

from starsd import defaults as d

from . import factories as f
from .schema_tools import apply_defaults, to_jsonschema

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")
VLLM_IMAGE = "reg/vllm-starsd:0.32"
PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"starsd.io/pool": "h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "80Gi"}},
}
ARGS = ["--max-num-seqs", "128", "--gpu-memory-utilization=0.9"]


def vllm_pool(**extra: Any) -> dict[str, Any]:
    return {"name": "v", "engine": "vllm", "image": VLLM_IMAGE, "vllm": {"args": list(ARGS)}, **PLACEMENT, **extra}


def mixed_spec(**overrides: Any) -> ClusterSpec:
    """A StarSD pool and a vLLM pool on the same kind of node, gamma 6 (not the default)."""
    raw = f.spec(
        target={"model": {"path": "/models/target"}, "gamma": 6},
        pools=[{"name": "s", **PLACEMENT}, vllm_pool()],
    )
    raw.update(copy.deepcopy(overrides))
    return parse(raw)


def statefulset(spec: ClusterSpec, pool: str, **kw: Any) -> dict[str, Any]:
    [p] = [p for p in spec.pools if p.name == pool]
    return targets.statefulset(f.OWNER, spec, p, 2, IMAGES, **kw)


def container(sts: dict[str, Any]) -> dict[str, Any]:
    [one] = sts["spec"]["template"]["spec"]["containers"]
    return dict(one)


def env(ctr: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr["env"]}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_a_vllm_pool_runs_vllm_serve_with_starsds_proposer_and_its_own_args_last() -> None:
    ctr = container(statefulset(mixed_spec(), "v"))
    command = ctr["command"]
    assert ctr["image"] == VLLM_IMAGE
    assert command[:3] == ["vllm", "serve", "/models/target"]
    assert flag(command, "--port") == str(c.TARGET_HTTP_PORT)
    # The name a StarSD target serves the same checkpoint by (its directory's name): one name per cluster.
    assert flag(command, "--served-model-name") == "target"
    speculative = json.loads(flag(command, "--speculative-config"))
    assert speculative == {
        "method": "custom_class",
        "model": "starsd.integrations.vllm.StarSDProposer",
        "num_speculative_tokens": 6,  # spec.target.gamma
    }
    assert command[-len(ARGS) :] == ARGS
    assert "--device" not in command  # vLLM finds its device; settle_serving leaves the command alone


def test_the_proposer_class_named_is_the_one_the_integration_exports() -> None:
    module, _, name = d.VLLM_PROPOSER_CLASS.rpartition(".")
    from starsd.integrations.vllm.proposer import StarSDProposer

    assert getattr(importlib.import_module(module), name) is StarSDProposer


def test_the_proposer_finds_the_drafts_live_and_each_replica_is_its_own_target() -> None:
    spec = mixed_spec()
    vllm_env = env(container(statefulset(spec, "v")))
    assert vllm_env["STARSD_DRAFT"] == naming.drafts_source(f.OWNER) == "dns:chat-draft-pods.ml.svc:50051"
    assert vllm_env["STARSD_TARGET_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert vllm_env["STARSD_POOL"] == "v"
    # What a StarSD target of the same cluster is given: the same headless Service.
    starsd_command = container(statefulset(spec, "s"))["command"]
    assert flag(starsd_command, "--drafts-from") == vllm_env["STARSD_DRAFT"]


def test_probes_are_on_vllms_health_with_the_pools_budget() -> None:
    spec = mixed_spec(target={"model": {"path": "/models/target"}, "probes": {"startupSeconds": 3600}})
    vllm, star = container(statefulset(spec, "v")), container(statefulset(spec, "s"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
        # Same periods, timeouts and thresholds as a StarSD target's: only the path differs.
        assert {k: v for k, v in vllm[probe].items() if k != "httpGet"} == {
            k: v for k, v in star[probe].items() if k != "httpGet"
        }
    assert vllm["startupProbe"]["failureThreshold"] == 360
    assert "lifecycle" not in vllm  # no /drain in vLLM; a StarSD target drains
    assert "preStop" in star["lifecycle"]


def test_the_pod_is_a_starsd_pools_but_for_the_serving_process() -> None:
    """Same port name (the Services route by it), labels, placement, GPU, resources, volumes and their size
    limits, security: everything but the container's image, command, environment, probes and drain hook."""
    spec = mixed_spec(target={"model": {"path": "/models/target"}, "sizeLimits": {"tmp": "3Gi", "shm": "16Gi"}})
    v_sts, s_sts = statefulset(spec, "v"), statefulset(spec, "s")
    v_pod, s_pod = v_sts["spec"]["template"], s_sts["spec"]["template"]
    own = ("image", "command", "env", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle")
    v_ctr = {k: v for k, v in container(v_sts).items() if k not in own}
    s_ctr = {k: v for k, v in container(s_sts).items() if k not in own}
    assert v_ctr == s_ctr
    assert v_ctr["ports"] == [{"name": "http", "containerPort": c.TARGET_HTTP_PORT, "protocol": "TCP"}]
    assert v_ctr["resources"] == {"limits": {"nvidia.com/gpu": "1", "memory": "80Gi"}, "requests": {"cpu": "2"}}
    assert {k: v for k, v in v_pod["spec"].items() if k != "containers"} == {
        k: v for k, v in s_pod["spec"].items() if k != "containers"
    }
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in v_pod["spec"]["volumes"]
    assert v_pod["spec"]["nodeSelector"] == PLACEMENT["nodeSelector"]
    assert v_pod["spec"]["tolerations"] == PLACEMENT["tolerations"]
    labels = v_pod["metadata"]["labels"]
    assert labels == naming.labels(f.OWNER, c.COMPONENT_TARGET, "v")
    assert v_sts["spec"]["selector"]["matchLabels"] == naming.selector_labels(f.OWNER, c.COMPONENT_TARGET, "v")


def test_the_draft_admits_vllm_pods_and_the_client_service_routes_to_them() -> None:
    labels = statefulset(mixed_spec(), "v")["spec"]["template"]["metadata"]["labels"]
    grpc = network.draft_policy(f.OWNER)["spec"]["ingress"][0]
    [peer] = grpc["from"]
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()
    assert targets.client_service(f.OWNER)["spec"]["selector"].items() <= labels.items()
    assert network.target_policy(f.OWNER, mixed_spec().network)["spec"]["podSelector"]["matchLabels"].items() <= (
        labels.items()
    )


def test_a_downloaded_model_is_loaded_from_where_the_downloader_put_it() -> None:
    spec = mixed_spec(target={"model": {"uri": "hf://org/target@v1"}})
    sts = statefulset(spec, "v")
    ctr = container(sts)
    assert ctr["command"][2] == MODEL_ROOT
    assert flag(ctr["command"], "--served-model-name") == "model"  # as `starsd target --model` names it
    [fetch] = sts["spec"]["template"]["spec"]["initContainers"]
    assert fetch["command"][:2] == ["starsd", "fetch-model"] and fetch["image"] == VLLM_IMAGE
    assert {"name": "model", "mountPath": MODEL_ROOT, "readOnly": True} in ctr["volumeMounts"]


def test_a_pools_own_model_is_the_one_vllm_serves() -> None:
    spec = mixed_spec(pools=[vllm_pool(model={"pvc": {"claimName": "weights", "subPath": "llama-70b"}})])
    ctr = container(statefulset(spec, "v"))
    assert ctr["command"][2] == MODEL_ROOT
    assert {"name": "model", "mountPath": MODEL_ROOT, "readOnly": True, "subPath": "llama-70b"} in ctr["volumeMounts"]


def test_the_api_key_reaches_vllm_from_the_secret_as_vllm_reads_it() -> None:
    spec = mixed_spec(auth={"apiKeySecretRef": {"name": "keys", "key": "api"}})
    state = apikey.KeyState(apikey.FOUND, spec.auth.api_key_secret, "digest1")
    sts = statefulset(spec, "v", api_key=state)
    vllm_env = env(container(sts))
    ref = {"secretKeyRef": {"name": "keys", "key": "api", "optional": False}}
    assert vllm_env[d.VLLM_API_KEY_ENV] == ref and d.API_KEY_ENV not in vllm_env
    assert sts["spec"]["template"]["metadata"]["annotations"][apikey.ANNOTATION_DIGEST] == "digest1"


def test_a_pod_template_may_not_replace_vllms_command() -> None:
    spec = mixed_spec(pools=[vllm_pool(podTemplate={"spec": {"containers": [{"name": "target", "args": ["x"]}]}})])
    with pytest.raises(SpecError, match="args"):
        statefulset(spec, "v")


def test_a_starsd_pool_renders_as_before_whether_or_not_it_names_its_engine() -> None:
    implicit = parse(f.spec())
    explicit_raw = f.spec()
    for pool in explicit_raw["pools"]:
        pool["engine"] = "starsd"
    explicit = parse(explicit_raw)
    assert implicit.pools == explicit.pools
    assert children.desired(f.OWNER, implicit, IMAGES) == children.desired(f.OWNER, explicit, IMAGES)
    command = container(statefulset(implicit, "h100"))["command"]
    assert command[:2] == ["starsd", "target"] and "vllm" not in command


def test_a_mixed_cluster_splits_its_targets_over_both_engines() -> None:
    spec = mixed_spec(targets={"replicas": 4})
    objs = children.desired(f.OWNER, spec, IMAGES)
    commands = {o["metadata"]["name"]: container(o)["command"][:2] for o in objs if o["kind"] == "StatefulSet"}
    assert commands == {"chat-target-s": ["starsd", "target"], "chat-target-v": ["vllm", "serve"]}
    assert sum(o["spec"]["replicas"] for o in objs if o["kind"] == "StatefulSet") == 4


@pytest.mark.parametrize(
    ("pool", "words"),
    [
        ({"name": "v", "engine": "vllm"}, "spec.pools[0].image: pool v: engine vllm needs an image"),
        ({"name": "s", "image": VLLM_IMAGE}, "pool s: image applies to engine vllm only"),
        ({"name": "s", "engine": "starsd", "vllm": {"args": []}}, "pool s: vllm applies to engine vllm only"),
        ({"name": "v", "engine": "tgi"}, "spec.pools[0].engine must be one of starsd, vllm"),
        (vllm_pool(vllm={"args": ["--port", "9000"]}), "vllm.args[0]: --port is set by the operator"),
        (vllm_pool(vllm={"args": ["--dtype", "half", "--port=9000"]}), "vllm.args[2]: --port is set by"),
        (vllm_pool(vllm={"args": ["--served_model_name", "x"]}), "--served_model_name is set by the operator"),
        (vllm_pool(vllm={"args": ["--speculative-config.num_speculative_tokens=2"]}), "is set by the operator"),
        (vllm_pool(vllm={"args": ["--model", "/m"]}), "--model is set by the operator"),
        (vllm_pool(vllm={"args": [7]}), "vllm.args must be a list of strings"),
    ],
)
def test_what_the_crds_engine_rules_refuse_the_parser_refuses_with_the_field(pool: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(f.spec(pools=[pool]))
    assert words in str(info.value)


def test_flags_that_merely_begin_like_the_operators_are_the_users() -> None:
    args = ["--port-range", "1", "--model-impl", "vllm", "--speculative-config-file", "x"]  # not vLLM's, not ours
    spec = parse(f.spec(pools=[vllm_pool(vllm={"args": args})]))
    assert spec.pools[0].vllm_args == tuple(args)


# --- the CRD agrees -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool_schema() -> dict[str, Any]:
    schema: dict[str, Any] = f.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    items: dict[str, Any] = schema["properties"]["spec"]["properties"]["pools"]["items"]
    return items


def test_the_crds_engine_fields_are_the_parsers(pool_schema: dict[str, Any]) -> None:
    props = pool_schema["properties"]
    assert props["engine"]["enum"] == list(d.ENGINES) and props["engine"]["default"] == d.ENGINES[0]
    args = props["vllm"]["properties"]["args"]
    assert args["maxItems"] == d.VLLM_ARGS_MAX
    [rule] = args["x-kubernetes-validations"]
    listed = rule["rule"][rule["rule"].index(" in [") + 4 : rule["rule"].rindex("]") + 1]
    assert yaml.safe_load(listed) == list(VLLM_OPERATOR_FLAGS)
    assert rule["messageExpression"].count("'--") == len(VLLM_OPERATOR_FLAGS)  # the same list, to name the flag
    rules = " ".join(r["rule"] for r in pool_schema["x-kubernetes-validations"])
    for needle in ("self.engine != 'vllm' || has(self.image)", "!has(self.image)", "!has(self.vllm)"):
        assert needle in rules


def test_a_vllm_pool_fits_the_schema_and_parses(pool_schema: dict[str, Any]) -> None:
    import jsonschema

    raw = f.spec(pools=[{"name": "s"}, vllm_pool()])
    defaulted = [apply_defaults(pool_schema, p) for p in raw["pools"]]
    validator = jsonschema.Draft7Validator(to_jsonschema(pool_schema))
    assert [list(validator.iter_errors(p)) for p in defaulted] == [[], []]
    assert defaulted[0]["engine"] == "starsd"
    assert parse({**raw, "pools": defaulted}) == parse(raw)


def test_the_proposer_accepts_the_environment_the_operator_gives_it() -> None:
    """What the pod's environment and speculative config say, read by the proposer's own configuration loader
    (the downward API's pod name filled in as the kubelet would)."""
    from starsd.integrations.vllm.config import load_config

    ctr = container(statefulset(mixed_spec(), "v"))
    pod_env = {
        e["name"]: e.get("value", "chat-target-v-1")
        for e in ctr["env"]
        if "value" in e or e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name"
    }
    tokens = json.loads(flag(ctr["command"], "--speculative-config"))["num_speculative_tokens"]
    config = load_config(pod_env, tokens)
    assert str(config.source) == "dns:chat-draft-pods.ml.svc:50051"
    assert (config.target_id, config.gamma) == ("chat-target-v-1", 6)
