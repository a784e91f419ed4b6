"""Pod templates: the user's fields kept, the star's fields enforced, conflicts refused with the field named."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from starsd_operator import children, draft, targets
from starsd_operator.podspec import Images
from starsd_operator.spec import SpecError, parse

from . import factories as f

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")

# Everything a platform team adds, in one template.
FULL: dict[str, Any] = {
    "metadata": {"labels": {"team": "ml", "cost-center": "42"}, "annotations": {"prometheus.io/scrape": "true"}},
    "spec": {
        "priorityClassName": "inference-high",
        "serviceAccountName": "starsd-models",
        "runtimeClassName": "nvidia",
        "schedulerName": "volcano",
        "terminationGracePeriodSeconds": 600,
        "imagePullSecrets": [{"name": "registry"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "nodeSelector": {"zone": "a"},
        "securityContext": {"supplementalGroups": [2000]},
        "volumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
        "initContainers": [{"name": "proxy", "image": "envoy:1", "restartPolicy": "Always"}],
        "containers": [
            {
                "name": "target",
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "envFrom": [{"configMapRef": {"name": "tuning"}}],
                "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}],
                "resources": {"limits": {"memory": "90Gi"}, "requests": {"cpu": "8"}},
                "securityContext": {"readOnlyRootFilesystem": False},
                "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
            },
            {"name": "log-shipper", "image": "fluent-bit:3"},
        ],
    },
}


def target_template(template: dict[str, Any], **pool: Any) -> dict[str, Any]:
    spec = parse(
        f.spec(
            target={"model": {"uri": "hf://org/target"}},
            pools=[{"name": "h100", "podTemplate": template, "resources": {"limits": {"nvidia.com/gpu": "1"}}, **pool}],
        )
    )
    result: dict[str, Any] = targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)["spec"]["template"]
    return result


def base_template() -> dict[str, Any]:
    spec = parse(
        f.spec(
            target={"model": {"uri": "hf://org/target"}},
            pools=[{"name": "h100", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        )
    )
    result: dict[str, Any] = targets.statefulset(f.OWNER, spec, spec.pools[0], 1, IMAGES)["spec"]["template"]
    return result


def test_every_user_field_lands_in_the_pod() -> None:
    merged = target_template(FULL, nodeSelector={"starsd.io/pool": "h100"})
    base = base_template()
    user = FULL["spec"]
    pod = merged["spec"]
    assert merged["metadata"]["labels"] == {**base["metadata"]["labels"], "team": "ml", "cost-center": "42"}
    assert merged["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    for key in (
        "priorityClassName",
        "serviceAccountName",
        "runtimeClassName",
        "schedulerName",
        "terminationGracePeriodSeconds",
        "imagePullSecrets",
        "affinity",
        "topologySpreadConstraints",
        "tolerations",
    ):
        assert pod[key] == user[key], key
    assert pod["nodeSelector"] == {"starsd.io/pool": "h100", "zone": "a"}
    assert pod["securityContext"] == {**base["spec"]["securityContext"], "supplementalGroups": [2000]}
    assert pod["volumes"] == [*base["spec"]["volumes"], *user["volumes"]]
    assert [c["name"] for c in pod["initContainers"]] == ["proxy", "fetch-model"]
    assert [c["name"] for c in pod["containers"]] == ["target", "log-shipper"]
    star, own = pod["containers"][0], base["spec"]["containers"][0]
    assert star["env"] == [*own["env"], {"name": "NCCL_DEBUG", "value": "INFO"}]
    assert star["envFrom"] == [{"configMapRef": {"name": "tuning"}}]
    assert star["volumeMounts"] == [
        *own["volumeMounts"],
        {"name": "certs", "mountPath": "/etc/certs", "readOnly": True},
    ]
    assert star["resources"] == {"limits": {"nvidia.com/gpu": "1", "memory": "90Gi"}, "requests": {"cpu": "8"}}
    assert star["securityContext"] == {**own["securityContext"], "readOnlyRootFilesystem": False}
    assert star["lifecycle"] == {"postStart": {"exec": {"command": ["true"]}}}


def test_the_stars_fields_are_kept() -> None:
    merged = target_template(FULL)
    base = base_template()
    star, own = merged["spec"]["containers"][0], base["spec"]["containers"][0]
    for key in ("name", "image", "command", "ports", "readinessProbe"):
        assert star[key] == own[key], key
    assert merged["spec"]["initContainers"][1] == base["spec"]["initContainers"][0]


def test_without_a_template_the_pod_is_the_operators() -> None:
    assert target_template({}) == base_template()


def test_the_template_is_not_changed_by_merging() -> None:
    template = copy.deepcopy(FULL)
    target_template(template)
    target_template(template)
    assert template == FULL


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"spec": {"containers": [{"name": "target", "image": "mine:1"}]}}, "spec.containers[0].image"),
        ({"spec": {"containers": [{"name": "target", "command": ["sh"]}]}}, "spec.containers[0].command"),
        ({"spec": {"containers": [{"name": "target", "args": ["--x"]}]}}, "spec.containers[0].args"),
        ({"spec": {"containers": [{"name": "target", "ports": []}]}}, "spec.containers[0].ports"),
        (
            {"spec": {"containers": [{"name": "target", "env": [{"name": "POD_NAME", "value": "x"}]}]}},
            "spec.containers[0].env[0]: the operator sets POD_NAME",
        ),
        (
            {"spec": {"containers": [{"name": "target", "volumeMounts": [{"name": "x", "mountPath": "/tmp"}]}]}},
            "spec.containers[0].volumeMounts[0]: the operator mounts /tmp",
        ),
        ({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}, "spec.volumes[0].name"),
        ({"spec": {"volumes": [{"name": "model-cache", "emptyDir": {}}]}}, "spec.volumes[0].name"),
        ({"spec": {"initContainers": [{"name": "fetch-model", "image": "x"}]}}, "spec.initContainers[0].name"),
        ({"spec": {"containers": [{"name": "x"}, {"name": "fetch-model", "image": "x"}]}}, "spec.containers[1].name"),
        (
            {"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}},
            "metadata.labels[app.kubernetes.io/instance]",
        ),
        ({"spec": {"nodeSelector": {"starsd.io/pool": "l4"}}}, "spec.nodeSelector[starsd.io/pool]"),
        ({"spec": {"containers": {"name": "target"}}}, "spec.containers must be a list"),
        ({"spec": {"volumes": [{"secret": {}}]}}, "spec.volumes[0].name is required"),
        ({"metadata": {"labels": {"a": 1}}}, "metadata.labels must map keys to strings"),
        ([], "must be an object"),
    ],
)
def test_conflicts_and_malformed_templates_are_refused_naming_the_field(template: Any, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec = parse(
            f.spec(pools=[{"name": "h100", "nodeSelector": {"starsd.io/pool": "h100"}, "podTemplate": template}])
        )
        children.desired(f.OWNER, spec, IMAGES)
    assert f"spec.pools[0].podTemplate.{field}".rstrip(".") in str(caught.value) or (
        field.startswith("must") and "spec.pools[0].podTemplate must be an object" in str(caught.value)
    )


def test_a_matching_operator_label_or_selector_is_no_conflict() -> None:
    template = {"metadata": {"labels": {"app.kubernetes.io/instance": "chat"}}, "spec": {"nodeSelector": {"p": "a"}}}
    merged = target_template(template, nodeSelector={"p": "a"})
    assert merged["metadata"]["labels"]["app.kubernetes.io/instance"] == "chat"
    assert merged["spec"]["nodeSelector"] == {"p": "a"}


def test_the_draft_takes_its_own_template() -> None:
    spec = parse(
        f.spec(
            draft={
                "model": {"path": "/models/draft"},
                "podTemplate": {"spec": {"priorityClassName": "draft-critical", "containers": [{"name": "draft"}]}},
            }
        )
    )
    pod = draft.deployment(f.OWNER, spec, IMAGES)["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "draft-critical"
    assert [c["name"] for c in pod["containers"]] == ["draft"]
    pools = [targets.statefulset(f.OWNER, spec, p, 1, IMAGES)["spec"]["template"]["spec"] for p in spec.pools]
    assert all("priorityClassName" not in p for p in pools)
