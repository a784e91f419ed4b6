"""The chart and the operator agree on the names they share: default images, labels, ports, the client
Service. Each side has its own copy of these; a change to one without the other fails here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from starsd_operator import constants

from .conftest import CHART, Rendered


def test_default_images_agree() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    images = {k: f"{v['repository']}:{v['tag']}" for k, v in values["images"].items()}
    assert images == {"draft": constants.DEFAULT_DRAFT_IMAGE, "target": constants.DEFAULT_TARGET_IMAGE}


def test_operator_env_names_agree(render: Callable[..., Rendered]) -> None:
    container = render().one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]}
    assert {constants.ENV_DRAFT_IMAGE, constants.ENV_TARGET_IMAGE} <= names


def test_service_monitors_select_the_operators_labels_and_ports(render: Callable[..., Rendered]) -> None:
    docs = render("servicemonitor.yaml")
    draft = docs.one("ServiceMonitor", "-draft")["spec"]
    target = docs.one("ServiceMonitor", "-target")["spec"]
    assert draft["selector"]["matchLabels"] == {
        constants.LABEL_NAME: constants.APP_NAME,
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
        constants.LABEL_COMPONENT: constants.COMPONENT_DRAFT,
        constants.LABEL_SCRAPE: "true",
    }
    assert target["selector"]["matchLabels"] == {
        constants.LABEL_NAME: constants.APP_NAME,
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
        constants.LABEL_COMPONENT: constants.COMPONENT_TARGET,
        constants.LABEL_SCRAPE: "true",
    }


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against ``labels``."""
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def test_each_pod_is_scraped_once(render: Callable[..., Rendered]) -> None:
    """Every draft, target and operator pod is a scrape target of exactly one (ServiceMonitor, Service) pair:
    the ServiceMonitors the chart renders against the Services and pods the operator builds for a cluster of
    two drafts and two pools (and the chart's own operator pods)."""
    from starsd_operator import children
    from starsd_operator.naming import Owner
    from starsd_operator.podspec import Images
    from starsd_operator.spec import parse

    docs = render("servicemonitor.yaml", sets=("operator.replicas=2",))
    spec = parse(
        {
            "draft": {"model": {"path": "/m/d"}, "replicas": 2},
            "target": {"model": {"path": "/m/t"}},
            "targets": {"replicas": 5},
            "pools": [{"name": "h100", "weight": 2}, {"name": "l4", "weight": 1}],
        }
    )
    objs = children.desired(Owner("chat", "ml", "uid"), spec, Images())
    objs += [d for d in docs if d["kind"] in ("Service", "Deployment") and d["metadata"]["name"].endswith(
        ("-operator", "-operator-metrics"))]  # fmt: skip
    services = [o for o in objs if o["kind"] == "Service"]
    pods: dict[str, tuple[str, dict[str, str], set[str]]] = {}  # name -> (namespace, labels, port names)
    for workload in (o for o in objs if o["kind"] in ("StatefulSet", "Deployment")):
        template = workload["spec"]["template"]
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports") or []}
        namespace = workload["metadata"].get("namespace", "starsd-system")
        for i in range(int(workload["spec"]["replicas"])):
            pods[f"{workload['metadata']['name']}-{i}"] = (namespace, template["metadata"]["labels"], ports)
    assert len(pods) == 2 + 5 + 2
    scraped = {name: 0 for name in pods}
    for monitor in docs.of_kind("ServiceMonitor"):
        m = monitor["spec"]
        names = m["namespaceSelector"].get("matchNames")
        for svc in services:
            namespace = svc["metadata"].get("namespace", "starsd-system")
            if (names is not None and namespace not in names) or not _selects(m["selector"], svc["metadata"]["labels"]):
                continue
            by_name = {p["name"]: p for p in svc["spec"]["ports"]}
            for endpoint in m["endpoints"]:
                port = by_name.get(endpoint["port"])
                if port is None:
                    continue
                for name, (pod_ns, labels, container_ports) in pods.items():
                    selected = svc["spec"]["selector"].items() <= labels.items() and pod_ns == namespace
                    if selected and port["targetPort"] in container_ports:
                        scraped[name] += 1
    assert scraped == {name: 1 for name in pods}, scraped


def test_test_pod_calls_the_client_service_on_the_target_port(render: Callable[..., Rendered]) -> None:
    url = render("sample.yaml").one("Pod")["spec"]["containers"][0]["args"][1]
    # naming.client_service_name: the client Service carries the cluster's own name.
    assert url == f"http://chat.starsd-system.svc:{constants.TARGET_HTTP_PORT}/v1/completions"


def test_pods_run_as_the_user_the_images_create() -> None:
    for image in ("dataplane", "operator"):  # dataplane: the draft's and the target's
        dockerfile = (CHART.parents[1] / "images" / image / "Dockerfile").read_text()
        assert f"--uid {constants.RUN_AS_USER}" in dockerfile, image
        assert f"USER {constants.RUN_AS_USER}:{constants.RUN_AS_USER}" in dockerfile, image
