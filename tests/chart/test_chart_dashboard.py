"""The Grafana dashboard in the chart: rendered with the ServiceMonitors, and every series it queries is one the
servers export (so a renamed metric breaks this test, not a user's dashboard)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from starsd.draft.metrics import DraftMetrics
from starsd.verifier.metrics import TargetMetrics

from .conftest import CHART, Rendered

DASHBOARD = CHART / "dashboards" / "starsd.json"
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def exported_names() -> set[str]:
    names: set[str] = set()
    for registry in (TargetMetrics().registry, DraftMetrics(CollectorRegistry()).registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + s for s in SUFFIXES)
    return names


def queried_names(expr: str) -> set[str]:
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*[{\[])", expr))
    return {w for w in words if w.startswith(("vllm:", "starsd_"))}


def test_every_series_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = set().union(*(queried_names(e) for e in exprs))
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:spec_decode_num_accepted_tokens_per_pos_total"} <= queried
    assert queried <= exported_names(), queried - exported_names()
    vllm = [e for e in exprs if "vllm:" in e]
    assert vllm and all('model_name=~"$model_name"' in e for e in vllm)


def test_the_dashboard_renders_with_the_service_monitors(render: Callable[..., Rendered]) -> None:
    docs = render("servicemonitor.yaml")
    config = docs.one("ConfigMap", "-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["starsd.json"]) == json.loads(DASHBOARD.read_text())
    assert not [d for d in render().of_kind("ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
