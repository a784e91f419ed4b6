"""The chart's values: lint, a comment above every key, and a schema that refuses bad values."""

from __future__ import annotations

import re

import pytest
import yaml

from .conftest import CHART, VALUES_DIR, WITH_REGISTRY, run_helm


def test_helm_lint_passes_for_every_values_file(helm: str) -> None:
    for values in [None, *sorted(p.name for p in VALUES_DIR.glob("*.yaml"))]:
        args = ["lint", "--strict", str(CHART)] + (["-f", str(VALUES_DIR / values)] if values else [])
        proc = run_helm(helm, *args)
        assert proc.returncode == 0, f"helm lint ({values or 'defaults'}):\n{proc.stdout}{proc.stderr}"


KEY = re.compile(r"^(?P<indent> *)(?:- )?(?P<key>[\w./-]+):(?: |$)")


def uncommented_keys(text: str) -> list[str]:
    """Keys of values.yaml whose line is not preceded by a comment line.

    Entries of `tolerations` lists are Kubernetes objects shown as examples and are not checked.
    """
    missing: list[str] = []
    previous = ""
    skip_deeper_than: int | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        match = KEY.match(line)
        indent = len(line) - len(line.lstrip(" "))
        if skip_deeper_than is not None and indent > skip_deeper_than:
            previous = stripped
            continue
        skip_deeper_than = None
        if match and not stripped.startswith("#"):
            if not previous.startswith("#") and not previous.startswith("- #"):
                missing.append(f"line {number}: {match['key']}")
            if match["key"] == "tolerations":
                skip_deeper_than = indent
        previous = stripped
    return missing


def test_every_key_in_values_yaml_has_a_comment_above_it() -> None:
    assert uncommented_keys((CHART / "values.yaml").read_text()) == []


def test_the_comment_check_finds_an_uncommented_key() -> None:
    text = "# documented\na: 1\nb: 2\n# nested parent\nc:\n  d: 3\n"
    assert uncommented_keys(text) == ["line 3: b", "line 6: d"]


BAD_VALUES = [
    (["unknownTopLevel=1"], "additional properties 'unknownTopLevel' not allowed"),
    (["operator.replicas=0"], "/operator/replicas"),
    (["operator.logLevel=LOUD"], "/operator/logLevel"),
    (["operator.image.tag=latest"], "/operator/image/tag"),
    (["operator.image.pullPolicy=Sometimes"], "/operator/image/pullPolicy"),
    (["operator.healthPort=http"], "/operator/healthPort"),
    (["serviceAccount.create=maybe"], "/serviceAccount/create"),
    (["cluster.targets.replicas=-1"], "/cluster/targets/replicas"),
    (["cluster.target.gamma=0"], "/cluster/target/gamma"),
    (["cluster.pools={}"], "/cluster/pools"),
    (["cluster.pools[0].name=H100"], "/cluster/pools/0/name"),
    (["cluster.pools[0].colour=red"], "additional properties 'colour' not allowed"),
    (["cluster.pools[0].engine=tgi"], "/cluster/pools/0/engine"),
    (["cluster.autoscaling.underloadedUtilization=1.5"], "/cluster/autoscaling/underloadedUtilization"),
    (["serviceMonitor.interval=often"], "/serviceMonitor/interval"),
    (["images.target.repository="], "/images/target/repository"),
    (["image.registry=https://registry.example"], "/image/registry"),
    (["image.registry=registry.example/team/"], "/image/registry"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_VALUES, ids=[s[0] for s, _ in BAD_VALUES])
def test_schema_refuses_bad_values(helm: str, sets: list[str], message: str) -> None:
    args = ["template", "rel", str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode != 0, f"helm accepted {sets}"
    assert message in proc.stderr, proc.stderr


def test_schema_accepts_the_shipped_values_files(helm: str) -> None:
    for values in sorted(VALUES_DIR.glob("*.yaml")):
        proc = run_helm(helm, "template", "rel", str(CHART), *WITH_REGISTRY, "-f", str(values))
        assert proc.returncode == 0, f"{values.name}: {proc.stderr}"


@pytest.mark.parametrize("values", [None, "sample.yaml"])
def test_without_a_registry_the_chart_refuses_to_render_and_says_how_to_get_one(helm: str, values: str | None) -> None:
    """No image is published: a default would name images no registry holds (every pod in ImagePullBackOff)."""
    extra = ["-f", str(VALUES_DIR / values)] if values else []
    proc = run_helm(helm, "template", "rel", str(CHART), *extra)
    assert proc.returncode != 0, "helm rendered the chart without image.registry"
    assert "image.registry is required" in proc.stderr
    assert "make images REGISTRY=" in proc.stderr and "PUSH=1" in proc.stderr
    assert "--set image.registry=" in proc.stderr


def test_with_a_registry_every_image_comes_from_it(helm: str) -> None:
    proc = run_helm(helm, "template", "rel", str(CHART), "--set", "image.registry=registry.example.com:5000/team",
                    "-f", str(VALUES_DIR / "sample.yaml"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    images = [
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "Pod"}
        for c in (d["spec"].get("template", d)["spec"]["containers"])
    ]
    env = [
        e["value"]
        for d in docs
        if d["kind"] == "Deployment"
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"].endswith("_IMAGE")
    ]
    assert sorted(images + env) == sorted(
        f"registry.example.com:5000/team/starsd/{name}:0.1.0" for name in ("operator", "target", "draft", "target")
    )


def test_default_image_tags_match_the_chart_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tags = {
        "operator": values["operator"]["image"]["tag"],
        "draft": values["images"]["draft"]["tag"],
        "target": values["images"]["target"]["tag"],
    }
    assert tags == dict.fromkeys(tags, chart["appVersion"])
