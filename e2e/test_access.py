"""Who may call the targets, on the real API server: a StarSDCluster with ``spec.auth`` and
``spec.network.clients`` is accepted, its children exist (the key as env from the Secret, the targets'
NetworkPolicy beside the draft's), a Secret that is not there shows in AuthReady and Ready, creating it clears
them, and a changed key reaches the pools' templates as a new digest (what rolls them)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, KubectlError, condition, wait_until

pytestmark = pytest.mark.usefixtures("operator")

AUTH = {"apiKeySecretRef": {"name": "chat-keys", "key": "api-key"}}
CLIENTS = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}},
    {"podSelector": {"matchLabels": {"app": "api-client"}}},
]
DIGEST = "starsd.io/api-key-digest"


def _secret(value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "chat-keys"},
        "type": "Opaque",
        "data": {"api-key": base64.b64encode(value.encode()).decode()},
    }


def _auth_condition(cluster: Cluster, namespace: str, name: str, status: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        cond = condition(ssd.get(cluster, namespace, name), "AuthReady")
        return cond if cond and cond["status"] == status else None

    return wait_until(f"AuthReady={status} on {namespace}/{name}", found, timeout=90)


def _target_sets(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=target"
    sets: list[dict[str, Any]] = cluster.get("statefulsets", namespace=namespace, selector=selector)
    return sets


def _digests(cluster: Cluster, namespace: str, name: str) -> set[str | None]:
    return {
        (s["spec"]["template"]["metadata"].get("annotations") or {}).get(DIGEST)
        for s in _target_sets(cluster, namespace, name)
    }


def test_a_cluster_with_auth_and_clients_is_accepted_and_a_missing_secret_is_reported(
    cluster: Cluster, namespace: str
) -> None:
    doc = ssd.sample("keyed")
    doc["spec"]["auth"] = AUTH
    doc["spec"]["network"] = {"clients": CLIENTS}
    ssd.apply(cluster, namespace, doc)

    # The Secret does not exist yet: the children are made all the same, and the status says what is missing.
    cond = _auth_condition(cluster, namespace, "keyed", "False")
    assert cond["reason"] == "SecretNotFound" and "chat-keys" in cond["message"]
    ready = condition(ssd.get(cluster, namespace, "keyed"), "Ready")
    assert ready is not None and ready["status"] == "False"

    def made() -> dict[str, list[str]] | None:
        kids = ssd.children(cluster, namespace, "keyed")
        made_all = kids["deployments"] == ["keyed-draft"] and len(kids["statefulsets"]) == 2  # the draft, two pools
        return kids if made_all and len(kids["networkpolicies"]) == 2 else None

    kids = wait_until("the children of keyed", made, timeout=60)
    assert kids["networkpolicies"] == ["keyed-draft", "keyed-target"]
    sets = _target_sets(cluster, namespace, "keyed")
    assert len(sets) == 2
    for sts in sets:
        (main,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "target"]
        env = {e["name"]: e for e in main["env"]}
        assert env["STARSD_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "chat-keys",
            "key": "api-key",
            "optional": False,
        }
        assert "value" not in env["STARSD_API_KEY"]
    policy = cluster.get("networkpolicy", "keyed-target", namespace)
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "target"
    assert policy["spec"]["ingress"] == [{"from": CLIENTS, "ports": [{"port": 8000, "protocol": "TCP"}]}]
    assert _digests(cluster, namespace, "keyed") == {None}

    # The Secret arrives: AuthReady turns True and the pools' templates carry the key's digest.
    cluster.apply(json.dumps(_secret("sk-first-0123456789abcdef")), namespace=namespace)
    _auth_condition(cluster, namespace, "keyed", "True")
    first = wait_until(
        "the key's digest in every pool's template",
        lambda: (d := _digests(cluster, namespace, "keyed")) != {None} and len(d) == 1 and d,
        timeout=60,
    )

    # A new key (the old one kept while the pods roll): a new digest, so a new template for the rollout.
    rotated = _secret("sk-second-fedcba9876543210,sk-first-0123456789abcdef")
    cluster.apply(json.dumps(rotated), namespace=namespace)
    second = wait_until(
        "a new digest after the key changed",
        lambda: (d := _digests(cluster, namespace, "keyed")) != first and None not in d and len(d) == 1 and d,
        timeout=60,
    )  # every pool takes the new template, one after the other (a held pool replaces no pod until its turn)
    assert second != first and len(second) == 1
    for sts in _target_sets(cluster, namespace, "keyed"):
        assert "sk-second" not in str(sts) and "sk-first" not in str(sts)


def test_a_client_without_selectors_is_refused_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    doc = ssd.sample("badclients")
    doc["spec"]["network"] = {"clients": [{}]}
    with pytest.raises(KubectlError) as caught:
        ssd.apply(cluster, namespace, doc)
    assert "a client needs a namespaceSelector, a podSelector or both" in str(caught.value)
