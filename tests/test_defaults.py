"""starsd.defaults is the one place of StarSD's defaults and limits: the files that cannot import it agree.

The CRD (crds/ and the chart's copy), the chart's values.yaml, values.schema.json and sample template, the
Dockerfiles and the commands' flags each repeat some of these numbers; every check here names the file and
the field that disagrees.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from starsd import defaults as d
from starsd.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "crds" / "starsdcluster.yaml", ROOT / "charts" / "starsd" / "crds" / "starsdcluster.yaml"]
CHART = ROOT / "charts" / "starsd"

LIFECYCLE = {
    "terminationGracePeriodSeconds": {"default": d.GRACE_SECONDS, "minimum": 0, "maximum": d.GRACE_SECONDS_MAX},
    "probes.startupSeconds": {
        "default": d.STARTUP_SECONDS,
        "minimum": d.STARTUP_SECONDS_MIN,
        "maximum": d.STARTUP_SECONDS_MAX,
    },
    "probes.readinessPeriodSeconds": {
        "default": d.READINESS_PERIOD_SECONDS,
        "minimum": 1,
        "maximum": d.PROBE_PERIOD_SECONDS_MAX,
    },
    "probes.livenessPeriodSeconds": {
        "default": d.LIVENESS_PERIOD_SECONDS,
        "minimum": 1,
        "maximum": d.PROBE_PERIOD_SECONDS_MAX,
    },
    "probes.timeoutSeconds": {"default": d.PROBE_TIMEOUT_SECONDS, "minimum": 1, "maximum": d.PROBE_TIMEOUT_SECONDS_MAX},
}


def _fraction(default: float) -> dict[str, Any]:
    return {"default": default, "minimum": 0, "maximum": 1}


def _rules(window: int, step: int) -> dict[str, dict[str, Any]]:
    return {
        "stabilizationWindowSeconds": {"default": window, "minimum": 0, "maximum": d.STABILIZATION_WINDOW_SECONDS_MAX},
        "maxStep": {"default": step, "minimum": 1},
        "selectPolicy": {"default": d.SELECT_POLICIES[0], "enum": list(d.SELECT_POLICIES)},
        "policies[].type": {"enum": list(d.RATE_POLICY_TYPES)},
        "policies[].periodSeconds": {"minimum": 1, "maximum": d.RATE_POLICY_PERIOD_SECONDS_MAX},
    }


DRAFT_RANGE = {"minimum": d.DRAFT_REPLICAS_MIN, "maximum": d.DRAFT_REPLICAS_MAX}

# Every default, minimum, maximum and enum under spec that the CRD declares, by field path; the test below
# also fails on a CRD default missing here, so a new one cannot slip past this module.
EXPECTED: dict[str, dict[str, Any]] = {
    "imagePolicy": {"default": d.IMAGE_POLICIES[0], "enum": list(d.IMAGE_POLICIES)},
    **{f"{role}.{k}": v for role in ("draft", "target") for k, v in LIFECYCLE.items()},
    "draft.disruption.maxUnavailable": {"default": d.MAX_UNAVAILABLE},
    "draft.replicas": {"default": d.DRAFT_REPLICAS, **DRAFT_RANGE},
    "draft.dtype": {"default": d.DTYPES[0], "enum": list(d.DTYPES)},
    "draft.maxBatch": {
        "default": d.DRAFT_MAX_BATCH,
        "minimum": d.DRAFT_MAX_BATCH_MIN,
        "maximum": d.DRAFT_MAX_BATCH_MAX,
    },
    "draft.schedule": {"default": d.DRAFT_SCHEDULES[0], "enum": list(d.DRAFT_SCHEDULES)},
    "target.dtype": {"default": d.DTYPES[0], "enum": list(d.DTYPES)},
    "target.maxNumSeqs": {"default": d.MAX_NUM_SEQS, "minimum": d.MAX_NUM_SEQS_MIN, "maximum": d.MAX_NUM_SEQS_MAX},
    "target.maxPrefillTokens": {"default": d.MAX_PREFILL_TOKENS, "minimum": 1},
    "target.gamma": {"default": d.GAMMA},  # its range is a CEL rule (checked below)
    "target.adaptiveGamma": {"default": False},
    **{
        f"{role}.sizeLimits.{key}": {"default": value}
        for role in ("draft", "target")
        for key, value in (("tmp", d.TMP_SIZE_LIMIT), ("shm", d.SHM_SIZE_LIMIT), ("model", d.MODEL_SIZE_LIMIT))
    },
    "target.rollout.minReadySeconds": {
        "default": d.MIN_READY_SECONDS,
        "minimum": 0,
        "maximum": d.MIN_READY_SECONDS_MAX,
    },
    "target.rollout.progressDeadlineSeconds": {
        "default": d.PROGRESS_DEADLINE_SECONDS,
        "minimum": 1,
        "maximum": d.PROGRESS_DEADLINE_SECONDS_MAX,
    },
    "targets.replicas": {"default": d.TARGET_REPLICAS, "minimum": 0},
    "pools[].weight": {"default": d.POOL_WEIGHT, "minimum": 0, "maximum": d.POOL_WEIGHT_MAX},
    "pools[].minReplicas": {"default": d.POOL_MIN_REPLICAS, "minimum": 0},
    "pools[].maxReplicas": {"default": d.POOL_MAX_REPLICAS, "minimum": 0, "maximum": d.POOL_REPLICAS_MAX},
    "pools[].disruption.maxUnavailable": {"default": d.MAX_UNAVAILABLE},
    "pools[].engine": {"default": d.ENGINES[0], "enum": list(d.ENGINES)},
    "autoscaling.enabled": {"default": False},
    "autoscaling.minTargets": {"default": d.MIN_TARGETS, "minimum": 0},
    "autoscaling.maxTargets": {"default": d.MAX_TARGETS, "minimum": 0},
    "autoscaling.minDrafts": {"default": d.MIN_DRAFTS, **DRAFT_RANGE},
    "autoscaling.maxDrafts": {"default": d.MAX_DRAFTS, **DRAFT_RANGE},
    "autoscaling.underloadedUtilization": _fraction(d.UNDERLOADED_UTILIZATION),
    "autoscaling.saturatedUtilization": _fraction(d.SATURATED_UTILIZATION),
    "autoscaling.scaleInOccupancy": _fraction(d.SCALE_IN_OCCUPANCY),
    "autoscaling.saturatedOccupancy": _fraction(d.SATURATED_OCCUPANCY),
    "autoscaling.tolerance": _fraction(d.TOLERANCE),
    "autoscaling.scaleInWhileWaiting": {"default": False},
    **{f"autoscaling.scaleUp.{k}": v for k, v in _rules(d.SCALE_UP_WINDOW_SECONDS, d.SCALE_UP_MAX_STEP).items()},
    **{f"autoscaling.scaleDown.{k}": v for k, v in _rules(d.SCALE_DOWN_WINDOW_SECONDS, d.SCALE_DOWN_MAX_STEP).items()},
    "autoscaling.convergenceTimeoutSeconds": {
        "default": d.CONVERGENCE_TIMEOUT_SECONDS,
        "minimum": 0,
        "maximum": d.CONVERGENCE_TIMEOUT_SECONDS_MAX,
    },
}
# Fields whose bounds are Kubernetes' (tolerations, label selectors) or a model source's, not StarSD's defaults.
# (sizeLimits.model is StarSD's: the size of a model's emptyDir.)
FOREIGN = re.compile(
    r"(^|(?<!sizeLimits)\.)(model|podTemplate|tolerations\[\]|policies\[\]\.value|clients\[\])(\.|$)|kvCacheTokens$"
)
CHECKED = ("default", "minimum", "maximum", "enum")


def declared(node: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """``{field path: {default/minimum/maximum/enum}}`` of every scalar bound under ``node``."""
    found: dict[str, dict[str, Any]] = {}
    bounds = {k: node[k] for k in CHECKED if k in node and not isinstance(node[k], dict)}
    if bounds and path and not FOREIGN.search(path):
        found[path] = bounds
    for key, child in (node.get("properties") or {}).items():
        found.update(declared(child, f"{path}.{key}" if path else key))
    if isinstance(node.get("items"), dict):
        found.update(declared(node["items"], f"{path}[]"))
    return found


def spec_schema(crd_path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(crd_path.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


@pytest.mark.parametrize("crd_path", CRDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_crds_defaults_and_limits_are_starsd_defaults(crd_path: Path) -> None:
    assert declared(spec_schema(crd_path)) == EXPECTED


def test_the_comparison_finds_a_changed_default() -> None:
    schema = spec_schema(CRDS[0])
    schema["properties"]["target"]["properties"]["gamma"]["default"] = d.GAMMA + 1
    schema["properties"]["draft"]["properties"]["maxBatch"]["maximum"] = d.DRAFT_MAX_BATCH_MAX * 2
    got = declared(schema)
    assert got != EXPECTED
    assert got["target.gamma"] == {"default": d.GAMMA + 1}


@pytest.mark.parametrize("crd_path", CRDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_crds_gamma_rule_and_description_use_the_range(crd_path: Path) -> None:
    target = spec_schema(crd_path)["properties"]["target"]
    [rule] = [r for r in target["x-kubernetes-validations"] if "gamma" in r["rule"]]
    assert f"self.gamma >= {d.GAMMA_MIN} && self.gamma <= {d.GAMMA_MAX}" in rule["rule"]
    span = f"{d.GAMMA_MIN}..{d.GAMMA_MAX}"
    assert span in rule["message"] and span in target["properties"]["gamma"]["description"]


def test_the_charts_sample_values_use_the_defaults() -> None:
    cluster = yaml.safe_load((CHART / "values.yaml").read_text())["cluster"]
    draft, target, auto = cluster["draft"], cluster["target"], cluster["autoscaling"]
    assert (draft["dtype"], draft["maxBatch"], draft["schedule"]) == (
        d.DTYPES[0],
        d.DRAFT_MAX_BATCH,
        d.DRAFT_SCHEDULES[0],
    )
    assert (target["gamma"], target["adaptiveGamma"], target["dtype"]) == (d.GAMMA, False, d.DTYPES[0])
    assert (target["maxNumSeqs"], target["maxPrefillTokens"]) == (d.MAX_NUM_SEQS, d.MAX_PREFILL_TOKENS)
    assert (auto["minTargets"], auto["maxTargets"]) == (d.MIN_TARGETS, d.MAX_TARGETS)
    assert (draft["replicas"], auto["minDrafts"], auto["maxDrafts"]) == (d.DRAFT_REPLICAS, d.MIN_DRAFTS, d.MAX_DRAFTS)
    assert (auto["underloadedUtilization"], auto["saturatedUtilization"]) == (
        d.UNDERLOADED_UTILIZATION,
        d.SATURATED_UTILIZATION,
    )
    assert (auto["scaleInOccupancy"], auto["saturatedOccupancy"]) == (d.SCALE_IN_OCCUPANCY, d.SATURATED_OCCUPANCY)
    assert auto["scaleUp"] == {"stabilizationWindowSeconds": d.SCALE_UP_WINDOW_SECONDS, "maxStep": d.SCALE_UP_MAX_STEP}
    assert auto["scaleDown"] == {
        "stabilizationWindowSeconds": d.SCALE_DOWN_WINDOW_SECONDS,
        "maxStep": d.SCALE_DOWN_MAX_STEP,
    }
    assert auto["convergenceTimeoutSeconds"] == d.CONVERGENCE_TIMEOUT_SECONDS


def test_the_charts_values_schema_uses_the_limits() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    cluster = schema["properties"]["cluster"]["properties"]
    draft, target = cluster["draft"]["properties"], cluster["target"]["properties"]
    assert (target["gamma"]["minimum"], target["gamma"]["maximum"]) == (d.GAMMA_MIN, d.GAMMA_MAX)
    assert (draft["maxBatch"]["minimum"], draft["maxBatch"]["maximum"]) == (
        d.DRAFT_MAX_BATCH_MIN,
        d.DRAFT_MAX_BATCH_MAX,
    )
    assert (target["maxNumSeqs"]["minimum"], target["maxNumSeqs"]["maximum"]) == (
        d.MAX_NUM_SEQS_MIN,
        d.MAX_NUM_SEQS_MAX,
    )
    assert draft["dtype"]["enum"] == target["dtype"]["enum"] == list(d.DTYPES)
    auto = cluster["autoscaling"]["properties"]
    for field in (draft["replicas"], auto["minDrafts"], auto["maxDrafts"]):
        assert (field["minimum"], field["maximum"]) == (d.DRAFT_REPLICAS_MIN, d.DRAFT_REPLICAS_MAX)
    assert draft["schedule"]["enum"] == list(d.DRAFT_SCHEDULES)


def test_the_charts_templates_fall_back_to_the_defaults() -> None:
    sample = (CHART / "templates" / "starsdcluster.yaml").read_text()
    fallbacks = dict(re.findall(r"^\s*(\w+): \{\{ \$c\.\w+\.\w+ \| default \"?(\w+)\"? \}\}$", sample, re.MULTILINE))
    assert fallbacks == {
        "replicas": str(d.DRAFT_REPLICAS),
        "dtype": d.DTYPES[0],
        "maxBatch": str(d.DRAFT_MAX_BATCH),
        "schedule": d.DRAFT_SCHEDULES[0],
        "adaptiveGamma": "false",
        "maxNumSeqs": str(d.MAX_NUM_SEQS),
        "maxPrefillTokens": str(d.MAX_PREFILL_TOKENS),
    }
    test_pod = (CHART / "templates" / "tests" / "test-completion.yaml").read_text()
    assert f".svc:{d.TARGET_HTTP_PORT}/v1/completions" in test_pod
    assert yaml.safe_load((CHART / "values.yaml").read_text())["operator"]["healthPort"] == d.OPERATOR_HEALTH_PORT


@pytest.mark.parametrize(
    ("image", "ports"),
    [("draft", [d.DRAFT_GRPC_PORT, d.DRAFT_METRICS_PORT]), ("target", [d.TARGET_HTTP_PORT])],
)
def test_the_images_expose_and_serve_on_the_default_ports(image: str, ports: list[int]) -> None:
    dockerfile = (ROOT / "images" / "dataplane" / "Dockerfile").read_text()
    stage = re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)
    [role] = [s for s in stage if s.startswith(f"runtime AS {image}\n")]  # the role's stage (--target)
    [expose] = re.findall(r"^EXPOSE (.+)$", role, re.MULTILINE)
    assert [int(p) for p in expose.split()] == ports
    [cmd] = re.findall(r"^CMD (\[.+\])$", role, re.MULTILINE)
    args = json.loads(cmd)
    served = [int(args[args.index(flag) + 1]) for flag in ("--port", "--metrics-port") if flag in args]
    assert served == ports


def parse(*argv: str) -> dict[str, Any]:
    return vars(build_parser(list(argv)).parse_args(list(argv)))


def test_the_commands_flags_default_to_the_defaults() -> None:
    target = parse("target", "--model", "m")
    assert (target["port"], target["gamma"], target["max_num_seqs"]) == (d.TARGET_HTTP_PORT, d.GAMMA, d.MAX_NUM_SEQS)
    assert (target["max_prefill_tokens"], target["gpu_memory_fraction"]) == (
        d.MAX_PREFILL_TOKENS,
        d.GPU_MEMORY_FRACTION,
    )
    assert (target["max_concurrency"], target["max_tokens_cap"]) == (d.TARGET_MAX_CONCURRENCY, d.MAX_TOKENS_CAP)
    assert (target["top_k"], target["draft_timeout"], target["max_body_bytes"]) == (
        d.PROPOSAL_TOP_K,
        d.DRAFT_TIMEOUT_SECONDS,
        d.MAX_BODY_BYTES,
    )
    draft = parse("draft", "--model", "m")
    assert (draft["port"], draft["metrics_port"], draft["max_gamma"]) == (
        d.DRAFT_GRPC_PORT,
        d.DRAFT_METRICS_PORT,
        d.GAMMA_MAX,
    )
    assert (draft["schedule"], draft["max_sessions"], draft["idle_timeout"]) == (
        d.DRAFT_SCHEDULES[0],
        d.DRAFT_MAX_SESSIONS,
        d.DRAFT_IDLE_TIMEOUT_SECONDS,
    )
    assert parse("local")["gamma"] == parse("demo")["gamma"] == d.GAMMA
    assert parse("operator")["liveness_port"] == d.OPERATOR_HEALTH_PORT


@pytest.mark.parametrize("command", ["target", "local", "demo"])
@pytest.mark.parametrize("gamma", [d.GAMMA_MIN - 1, d.GAMMA_MAX + 1])
def test_the_commands_refuse_a_gamma_outside_the_range(
    command: str, gamma: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from starsd.cli import main

    argv = [command, "--gamma", str(gamma)] + (["--model", "/nonexistent"] if command == "target" else [])
    assert main(argv) == 2
    assert f"--gamma must be in {d.GAMMA_MIN}..{d.GAMMA_MAX}, got {gamma}" in capsys.readouterr().err


@pytest.mark.parametrize("crd_path", CRDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_crds_resources_descriptions_give_the_default_requests(crd_path: Path) -> None:
    spec = yaml.safe_load(crd_path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    draft = spec["properties"]["draft"]["properties"]["resources"]["description"]
    pool = spec["properties"]["pools"]["items"]["properties"]["resources"]["description"]
    assert f'cpu "{d.DRAFT_CPU_REQUEST}" and memory {d.DRAFT_MEMORY_REQUEST}' in " ".join(draft.split())
    assert f'cpu "{d.TARGET_CPU_REQUEST}" and memory {d.TARGET_MEMORY_REQUEST}' in " ".join(pool.split())
