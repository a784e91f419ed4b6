"""A StarSDCluster with pod templates on the real API server: every user field lands in the workloads (after
the API server's own PodSpec validation and defaulting), and a template that sets the star's own fields is
refused in the cluster's status with the field named."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, condition, wait_until

pytestmark = pytest.mark.usefixtures("operator")

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "ml"}, "annotations": {"example.com/owner": "platform"}},
    "spec": {
        "priorityClassName": "system-cluster-critical",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 900,
        "imagePullSecrets": [{"name": "registry"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"team": "ml"}},
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"team": "ml"}},
            }
        ],
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {"supplementalGroups": [2000]},
        "volumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
        "containers": [
            {
                "name": "target",
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "envFrom": [{"configMapRef": {"name": "tuning", "optional": True}}],
                "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}],
            },
            {"name": "log-shipper", "image": "fluent-bit:3"},
        ],
    },
}


def _workload(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        items = [o for o in cluster.get(kind, namespace=namespace) if o["metadata"]["name"] == name]
        return items[0] if items else None

    return wait_until(f"{kind} {name}", found, timeout=60)


def _contains(whole: Any, part: Any) -> bool:
    """``part`` is in ``whole``: every key of a dict (recursively), every item of a list in order."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _contains(whole[k], v) for k, v in part.items())
    if isinstance(part, list):
        return isinstance(whole, list) and all(any(_contains(w, p) for w in whole) for p in part)
    return bool(whole == part)


def test_every_user_field_lands_in_the_pool_and_draft_pods(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("tpl")
    pool = doc["spec"]["pools"][0]
    pool["podTemplate"] = copy.deepcopy(TEMPLATE)
    draft_template = copy.deepcopy(TEMPLATE)
    draft_template["spec"]["containers"][0]["name"] = "draft"
    doc["spec"]["draft"]["podTemplate"] = draft_template
    ssd.apply(cluster, namespace, doc)

    for kind, name, template in (
        ("statefulsets", f"tpl-target-{pool['name']}", TEMPLATE),
        ("deployments", "tpl-draft", draft_template),
    ):
        landed = _workload(cluster, namespace, kind, name)["spec"]["template"]
        assert _contains(landed["metadata"], template["metadata"]), landed["metadata"]
        for key, value in template["spec"].items():
            assert _contains(landed["spec"][key], value), (name, key, landed["spec"].get(key))
        star = landed["spec"]["containers"][0]
        assert star["command"][:2] == ["starsd", template["spec"]["containers"][0]["name"]]
        assert landed["metadata"]["labels"]["app.kubernetes.io/instance"] == "tpl"


def test_a_template_that_sets_the_stars_command_is_refused_in_the_status(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("tplbad")
    doc["spec"]["pools"][0]["podTemplate"] = {"spec": {"containers": [{"name": "target", "command": ["sh"]}]}}
    ssd.apply(cluster, namespace, doc)

    def refused() -> dict[str, Any] | None:
        ready = condition(ssd.get(cluster, namespace, "tplbad"), "Ready")
        return ready if ready and ready["status"] == "False" and "podTemplate" in ready["message"] else None

    ready = wait_until("Ready=False naming the template's field", refused, timeout=60)
    assert "spec.pools[0].podTemplate.spec.containers[0].command" in ready["message"]
