"""The chart and the operator agree on the names they share: default images, labels, ports, the client
Service. Each side has its own copy of these; a change to one without the other fails here."""

from __future__ import annotations

from collections.abc import Callable

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
    }
    assert target["selector"]["matchLabels"][constants.LABEL_COMPONENT] == constants.COMPONENT_TARGET
    assert target["selector"]["matchExpressions"][0]["key"] == constants.LABEL_POOL


def test_test_pod_calls_the_client_service_on_the_target_port(render: Callable[..., Rendered]) -> None:
    url = render("sample.yaml").one("Pod")["spec"]["containers"][0]["args"][1]
    # naming.client_service_name: the client Service carries the cluster's own name.
    assert url == f"http://chat.starsd-system.svc:{constants.TARGET_HTTP_PORT}/v1/completions"


def test_pods_run_as_the_user_the_images_create() -> None:
    for image in ("draft", "target", "operator"):
        dockerfile = (CHART.parents[1] / "images" / image / "Dockerfile").read_text()
        assert f"--uid {constants.RUN_AS_USER}" in dockerfile, image
        assert f"USER {constants.RUN_AS_USER}:{constants.RUN_AS_USER}" in dockerfile, image
