"""crds/starsdcluster.yaml is a structural CRD that matches its contract (docs/architecture.md section 3) and the
operator's code."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from starsd_operator import constants as c
from starsd_operator import rollout, status
from starsd_operator import spec as specmod
from starsd_operator.rebalancer import Decision, Load

from . import factories as f
from .schema_tools import apply_defaults, to_jsonschema, walk


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return f.crd()


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    js = to_jsonschema(schema)
    js["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(js)


def errors(schema: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    defaulted = apply_defaults(schema, obj)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(schema).iter_errors(defaulted)]


def cluster(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "chat"}, "spec": spec}


def test_names_group_and_version_are_the_contract(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{c.PLURAL}.{c.GROUP}"
    spec = crd["spec"]
    assert spec["group"] == c.GROUP and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == c.KIND and spec["names"]["plural"] == c.PLURAL
    assert "ssd" in spec["names"]["shortNames"]
    [version] = spec["versions"]
    assert version["name"] == c.VERSION and version["served"] and version["storage"]


def test_status_and_scale_subresources(crd: dict[str, Any]) -> None:
    sub = crd["spec"]["versions"][0]["subresources"]
    assert sub["status"] == {}
    assert sub["scale"] == {
        "specReplicasPath": ".spec.targets.replicas",
        "statusReplicasPath": ".status.targets.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    default_view = [col["name"] for col in columns if col.get("priority", 0) == 0]
    assert default_view == ["Ready", "Targets", "Drafts", "Draft load", "Regime", "Age"]
    by_name = {col["name"]: col for col in columns}
    assert by_name["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    # "2/3" as a Deployment's READY: ready over desired, one string the status writes for it.
    assert (by_name["Targets"]["type"], by_name["Targets"]["jsonPath"]) == ("string", ".status.targets.readyOfDesired")
    targets = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["targets"]
    assert targets["properties"]["readyOfDesired"]["type"] == "string"
    assert (by_name["Drafts"]["type"], by_name["Drafts"]["jsonPath"]) == ("string", ".status.drafts.readyOfDesired")
    drafts = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["drafts"]
    assert drafts["properties"]["readyOfDesired"]["type"] == "string"
    assert by_name["Draft load"]["jsonPath"] == ".status.draft.utilization"
    assert by_name["Regime"]["jsonPath"] == ".status.draft.regime"
    assert by_name["Age"]["type"] == "date"


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    """Every node has a type (or is int-or-string), and nothing under spec keeps unknown fields but the pod
    templates' pod specs: a core/v1 PodSpec that the API server checks, field by field, when the operator
    applies the workload (copying the whole PodSpec schema in would add hundreds of kilobytes per copy)."""
    preserved = []
    for path, node in walk(schema):
        if path.startswith(".metadata"):
            continue
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            preserved.append(path)
    assert preserved == [".spec.draft.podTemplate.spec", ".spec.pools[].podTemplate.spec"]


def test_metadata_restricts_only_the_name_to_what_can_name_a_service(schema: dict[str, Any]) -> None:
    metadata = schema["properties"]["metadata"]
    assert set(metadata["properties"]) == {"name"}  # the API server allows no other metadata constraint
    name = metadata["properties"]["name"]
    assert name["maxLength"] == 63
    check = jsonschema.Draft7Validator({"type": "string", "pattern": name["pattern"]}).is_valid
    assert check("chat") and check("chat-2") and not check("2chat") and not check("chat.v2") and not check("Chat")


def test_list_maps_are_keyed_by_required_fields(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", [])), path
    pools = schema["properties"]["spec"]["properties"]["pools"]
    assert pools["x-kubernetes-list-type"] == "map" and pools["x-kubernetes-list-map-keys"] == ["name"]


def test_cel_rules_cover_the_cross_field_checks(schema: dict[str, Any]) -> None:
    rules = " ".join(r["rule"] for _, node in walk(schema) for r in node.get("x-kubernetes-validations", []))
    for needle in (
        "self.minTargets <= self.maxTargets",
        "self.minTargets >= 1",
        "self.minReplicas <= self.maxReplicas",
        "self.exists_one(q, q.name == p.name)",
        "self.gamma >= 1 && self.gamma <= 16",
        "size(self.pools) > 0",
        "self.targets.replicas >= self.autoscaling.minTargets",
        "self.targets.replicas <= self.autoscaling.maxTargets",
        "self.minDrafts <= self.maxDrafts",
        "self.draft.replicas >= self.autoscaling.minDrafts",
        "self.draft.replicas <= self.autoscaling.maxDrafts",
        "(has(self.path) ? 1 : 0) + (has(self.pvc) ? 1 : 0) + (has(self.uri) ? 1 : 0) == 1",
        "has(self.uri) || (!has(self.credentials) && !has(self.cache))",
        "self.engine != 'vllm' || has(self.image)",
        "(has(self.engine) && self.engine == 'vllm') || !has(self.vllm)",
    ):
        assert needle in rules, needle
    for _, node in walk(schema):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule.get("message") or rule.get("messageExpression"), rule["rule"]
            # string(int) has an unbounded estimated cost and the API server refuses the CRD
            # (kubernetes/kubernetes#124234); '%d'.format([...]) is within budget.
            assert "string(" not in rule.get("messageExpression", ""), rule["messageExpression"]


def test_a_minimal_spec_defaults_to_what_the_operator_assumes(schema: dict[str, Any]) -> None:
    minimal = {
        "draft": {"model": {"path": "/m/d"}},
        "target": {"model": {"path": "/m/t"}},
        "pools": [{"name": "a"}],
    }
    defaulted = apply_defaults(schema, cluster(minimal))["spec"]
    assert specmod.parse(defaulted) == specmod.parse(minimal)
    assert defaulted["autoscaling"]["enabled"] is False and defaulted["targets"]["replicas"] == 1
    assert defaulted["draft"]["replicas"] == 1
    assert (defaulted["autoscaling"]["minDrafts"], defaulted["autoscaling"]["maxDrafts"]) == (1, 1)


def test_the_sample_validates_and_parses(schema: dict[str, Any]) -> None:
    sample = f.sample()
    assert sample["apiVersion"] == c.API_VERSION and sample["kind"] == c.KIND
    assert errors(schema, sample) == []
    parsed = specmod.parse(apply_defaults(schema, sample)["spec"])
    assert [p.name for p in parsed.pools] == ["h100", "l4"]
    assert parsed.autoscaling.min_targets <= parsed.replicas <= parsed.autoscaling.max_targets


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda s: s["targets"].update(replicas=-1), "spec.targets.replicas"),
        (lambda s: s.update(colour="blue"), "spec"),
        (lambda s: s["draft"].update(replica=2), "spec.draft"),
        (lambda s: s["draft"].update(replicas=0), "spec.draft.replicas"),
        (lambda s: s["draft"].update(replicas=33), "spec.draft.replicas"),
        (lambda s: s["autoscaling"].update(maxDrafts=0), "spec.autoscaling.maxDrafts"),
        (lambda s: s["target"].update(gamma="4"), "spec.target.gamma"),
        (lambda s: s["pools"][0].pop("name"), "spec.pools.0"),
        (lambda s: s["pools"][0].update(name="H100"), "spec.pools.0.name"),
        (lambda s: s["pools"][0].update(minReplicas=-1), "spec.pools.0.minReplicas"),
        (lambda s: s["draft"]["model"].update(path="models/draft"), "spec.draft.model.path"),
        (lambda s: s["draft"].update(resources={"limits": {"nvidia.com/gpu": "one"}}), "spec.draft.resources"),
        (lambda s: s["pools"][0].update(tolerations=[{"operator": "Maybe"}]), "spec.pools.0.tolerations.0"),
        (lambda s: s["autoscaling"].update(underloadedUtilization=1.5), "spec.autoscaling"),
        (lambda s: s.pop("draft"), "spec"),
    ],
)
def test_the_schema_refuses(schema: dict[str, Any], mutate: Any, where: str) -> None:
    sample = f.sample()
    mutate(sample["spec"])
    found = errors(schema, sample)
    assert found, f"expected an error at {where}"
    assert any(e.startswith(where) for e in found), found


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s["autoscaling"].update(minTargets=5, maxTargets=2),
        lambda s: s["autoscaling"].update(minDrafts=3, maxDrafts=2),
        lambda s: s["draft"].update(replicas=3),  # the sample enables autoscaling; maxDrafts defaults to 1
        lambda s: (s["draft"].update(replicas=1), s["autoscaling"].update(minDrafts=2, maxDrafts=4)),
        lambda s: s["pools"][0].update(minReplicas=5, maxReplicas=2),
        lambda s: s["pools"].append(dict(s["pools"][0])),
        lambda s: s["target"].update(gamma=0),
        lambda s: s["target"].update(gamma=17),
        lambda s: s.update(pools=[]),
        lambda s: s["autoscaling"].update(underloadedUtilization=0.9, saturatedUtilization=0.8),
        lambda s: s["draft"].update(model={}),
        lambda s: s["draft"].update(model={"path": "/m", "uri": "hf://o/n"}),
        lambda s: s["target"].update(model={"path": "/m", "cache": {"claimName": "c"}}),
        lambda s: s["target"].update(model={"uri": "ftp://h/m.tar.gz"}),
        lambda s: s["pools"][0].update(model={"pvc": {"claimName": "c", "subPath": "a/../b"}}),
        lambda s: s["pools"][0].update(engine="vllm"),  # no image
        lambda s: s["pools"][0].update(image="reg/vllm:1"),  # on a starsd pool
        lambda s: s["pools"][0].update(vllm={"args": ["--max-num-seqs", "8"]}),  # on a starsd pool
        lambda s: s["pools"][0].update(engine="vllm", image="reg/vllm:1", vllm={"args": ["--port=1"]}),
    ],
)
def test_what_only_cel_catches_the_operator_refuses_too(schema: dict[str, Any], mutate: Any) -> None:
    """Behind a CRD without CEL (or an old API server) the operator still names the bad field."""
    sample = f.sample()
    mutate(sample["spec"])
    with pytest.raises(specmod.SpecError):
        specmod.parse(apply_defaults(schema, sample)["spec"])


def test_the_status_the_operator_writes_fits_the_schema(schema: dict[str, Any]) -> None:
    """Fields outside the status schema would be pruned, and kopf would see its patch not stick."""
    parsed = specmod.parse(f.spec(autoscaling={"enabled": True}))
    load = Load.from_json(
        {
            "utilization": 0.41,
            "window_seconds": 10,
            "tq_seconds": 0.004,
            "tp_seconds": 0.02,
            "tc_seconds": 0.001,
            "queue_depth": 0,
            "targets": 3,
            "regime": "UnderLoaded",
            "active_sessions": 9,
            "recommended_targets": 8,
            "running_requests": 40,
            "waiting_requests": 2,
            "target_occupancy": 0.62,
        }
    )
    obs = status.Observation(
        owner=f.OWNER,
        generation=2,
        spec=parsed,
        children=status.Children(
            deployments=[f.workload("Deployment", "chat-draft", 1)],
            statefulsets=[f.workload("StatefulSet", "chat-target-h100", 2)],
        ),
        load=load,
        decision=Decision(5, 3, "UnderLoaded", "3 -> 5 targets"),
        rollouts=[
            rollout.PoolRollout("h100", rollout.HALTED, 2, "halted at revision r2: ...", "chat-target-h100-2", 1)
        ],
    )
    built = status.build(obs, {"observedGeneration": 2}, datetime(2026, 1, 1, tzinfo=UTC))
    status_schema = copy.deepcopy(schema["properties"]["status"])
    jsonschema.Draft7Validator(to_jsonschema(status_schema)).validate(built)
    assert {cond["type"] for cond in built["conditions"]} == {
        c.COND_READY,
        c.COND_DRAFT_READY,
        c.COND_TARGETS_READY,
        c.COND_STAR_CONNECTED,
        c.COND_REBALANCING,
        c.COND_ROLLOUT_PROGRESSING,
        c.COND_AUTH_READY,
    }
    assert built["targets"]["pools"][0]["rollout"]["state"] == rollout.HALTED


def _model_schemas(schema: dict[str, Any]) -> list[dict[str, Any]]:
    s = schema["properties"]["spec"]["properties"]
    return [
        s["draft"]["properties"]["model"],
        s["target"]["properties"]["model"],
        s["pools"]["items"]["properties"]["model"],
    ]


def test_the_three_model_schemas_are_one_definition(schema: dict[str, Any]) -> None:
    draft, target, pool = (copy.deepcopy(m) for m in _model_schemas(schema))
    pool.pop("description")
    draft.pop("description")
    target.pop("description")
    assert draft == target == pool
    assert "model" in schema["properties"]["spec"]["properties"]["draft"]["required"]
    assert "model" not in schema["properties"]["spec"]["properties"]["pools"]["items"].get("required", [])


def test_the_uri_rule_allows_exactly_the_downloaders_schemes(schema: dict[str, Any]) -> None:
    import re

    from starsd import modeluri

    [rule] = _model_schemas(schema)[0]["properties"]["uri"]["x-kubernetes-validations"]
    pattern = re.search(r"matches\(r'(.*)'\)", rule["rule"])  # a raw CEL string: no escapes to undo
    assert pattern is not None
    allowed = re.search(r"\^\(([a-z0-9|]+)\)", pattern.group(1))
    assert allowed is not None and tuple(allowed.group(1).split("|")) == modeluri.SCHEMES
    regex = re.compile(pattern.group(1))
    for text in ("hf://o/n", "s3://b/p", "gs://b/p", "https://h/m.tar.gz"):
        assert regex.match(text), text
    for text in ("ftp://h/m", "http://h/m.tar.gz", "hf://o/n x", "/models/x"):
        assert not regex.match(text), text


@pytest.mark.parametrize(
    "model",
    [
        {"pvc": {"claimName": "models", "subPath": "draft"}},
        {"pvc": {"claimName": "models", "readOnly": False}},
        {"uri": "hf://org/name@abc", "credentials": {"secretRef": {"name": "hf"}}, "cache": {"claimName": "c"}},
        {"uri": "s3://bucket/prefix"},
        {"uri": "https://h/m.tar.gz"},
    ],
)
def test_every_model_source_fits_the_schema_and_parses(schema: dict[str, Any], model: dict[str, Any]) -> None:
    sample = f.sample()
    sample["spec"]["draft"]["model"] = model
    sample["spec"]["pools"][0]["model"] = model
    assert errors(schema, sample) == []
    parsed = specmod.parse(apply_defaults(schema, sample)["spec"])
    assert parsed.draft.model == parsed.pools[0].model


@pytest.mark.parametrize(
    ("model", "where"),
    [
        ({"pvc": {"subPath": "x"}}, "spec.draft.model.pvc"),
        ({"pvc": {"claimName": "c", "subPath": "/abs"}}, "spec.draft.model.pvc.subPath"),
        ({"uri": "hf://o/n", "credentials": {"secretRef": {}}}, "spec.draft.model.credentials.secretRef"),
        ({"uri": "hf://o/n", "cache": {}}, "spec.draft.model.cache"),
        ({"uri": "hf://o/n", "mirror": "x"}, "spec.draft.model"),
    ],
)
def test_the_schema_refuses_malformed_model_sources(schema: dict[str, Any], model: dict[str, Any], where: str) -> None:
    sample = f.sample()
    sample["spec"]["draft"]["model"] = model
    found = errors(schema, sample)
    assert any(e.startswith(where) for e in found), found
