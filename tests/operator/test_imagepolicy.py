"""spec.imagePolicy: a Pinned cluster keeps the images it was created with across an operator upgrade; a
FollowOperator cluster takes the operator's new defaults; a cluster from before the record keeps what runs."""

from __future__ import annotations

from typing import Any

from starsd_operator import controller, imagepolicy
from starsd_operator.controller import Config, Memory
from starsd_operator.podspec import Images

from . import factories as f
from .fakekube import FakeKube

OLD = Config(images=Images(draft="reg/draft:1.0", target="reg/target:1.0"))
NEW = Config(images=Images(draft="reg/draft:2.0", target="reg/target:2.0"))


def images_of(kube: FakeKube) -> set[str]:
    return {
        o["spec"]["template"]["spec"]["containers"][0]["image"]
        for (kind, _, _), o in kube.objects.items()
        if kind in ("Deployment", "StatefulSet")
    }


def created_with_old(spec: dict[str, Any]) -> tuple[FakeKube, dict[str, Any]]:
    kube, body = FakeKube(), f.body(spec)
    controller.reconcile(kube, body, OLD, Memory())
    body["status"]["images"] = controller.images_record(kube, body, OLD)
    return kube, body


def test_a_pinned_cluster_keeps_its_images_across_an_operator_upgrade() -> None:
    kube, body = created_with_old(f.spec())
    assert body["status"]["images"] == {"draft": "reg/draft:1.0", "target": "reg/target:1.0"}
    controller.reconcile(kube, body, NEW, Memory())  # the new operator resumes every cluster
    assert images_of(kube) == {"reg/draft:1.0", "reg/target:1.0"}
    assert controller.images_record(kube, body, NEW) == body["status"]["images"]


def test_follow_operator_takes_the_new_defaults() -> None:
    kube, body = created_with_old(f.spec(imagePolicy="FollowOperator"))
    controller.reconcile(kube, body, NEW, Memory())
    assert images_of(kube) == {"reg/draft:2.0", "reg/target:2.0"}
    assert controller.images_record(kube, body, NEW) == {"draft": "reg/draft:2.0", "target": "reg/target:2.0"}


def test_a_spec_override_wins_over_the_pin() -> None:
    kube, body = created_with_old(f.spec())
    body["spec"]["target"]["image"] = "reg/target:custom"
    controller.reconcile(kube, body, NEW, Memory())
    assert images_of(kube) == {"reg/draft:1.0", "reg/target:custom"}


def test_a_cluster_from_before_the_record_keeps_what_it_runs() -> None:
    kube, body = created_with_old(f.spec())
    del body["status"]["images"]
    controller.reconcile(kube, body, NEW, Memory())
    assert images_of(kube) == {"reg/draft:1.0", "reg/target:1.0"}
    assert controller.images_record(kube, body, NEW) == {"draft": "reg/draft:1.0", "target": "reg/target:1.0"}


def test_resolve_falls_back_to_the_operators_defaults() -> None:
    operator = Images(draft="d:2", target="t:2")
    assert imagepolicy.resolve("Pinned", operator, None) == operator
    assert imagepolicy.resolve("Pinned", operator, {"draft": "d:1"}) == Images(draft="d:1", target="t:2")
    assert imagepolicy.resolve("FollowOperator", operator, {"draft": "d:1", "target": "t:1"}) == operator
