"""Who may call the targets: ``spec.auth`` (the API key from a Secret, the AuthReady condition, rotation through
the rollout) and ``spec.network`` (the targets' NetworkPolicy), from the CRD's schema to the applied children."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from starsd_operator import apikey, children, controller, naming, network, rollout
from starsd_operator import constants as c
from starsd_operator.controller import Config, Memory
from starsd_operator.kube import KubeError
from starsd_operator.loadclient import LoadUnavailable
from starsd_operator.podspec import Images
from starsd_operator.spec import SpecError, parse

from . import factories as f
from .fakekube import FakeKube
from .schema_tools import apply_defaults, to_jsonschema

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")
CONFIG = Config(images=IMAGES)
NOW = datetime(2026, 12, 4, 18, 0, tzinfo=UTC)
KEY = "sk-live-3b9f0c2d4e6a8b1c5d7e9f0a2b4c6d8e"
AUTH = {"apiKeySecretRef": {"name": "chat-keys", "key": "api-key"}}
CLIENTS = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}},
    {"podSelector": {"matchLabels": {"app": "gateway"}}},
    {
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml", "search"]}]},
        "podSelector": {"matchLabels": {"role": "caller"}},
    },
]


def secret(value: str = KEY, *, key: str = "api-key", uid: str = "secret-uid-1", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "chat-keys", "namespace": f.OWNER.namespace, "uid": uid, "labels": dict(labels)},
        "data": {key: base64.b64encode(value.encode()).decode()},
    }


def target_sets(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["labels"][c.LABEL_COMPONENT] == "target"]


def container(sts: dict[str, Any]) -> dict[str, Any]:
    main: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return main


# --- the CRD and the spec ---------------------------------------------------------------------------------


def crd_errors(spec: dict[str, Any]) -> list[str]:
    root = f.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    js = to_jsonschema(root)
    js["properties"]["metadata"] = {"type": "object"}
    obj = apply_defaults(
        root, {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "chat"}, "spec": spec}
    )
    return [".".join(map(str, e.absolute_path)) for e in jsonschema.Draft7Validator(js).iter_errors(obj)]


def test_the_crd_takes_auth_and_network_clients_and_the_operator_parses_them() -> None:
    spec = f.spec(auth=AUTH, network={"clients": CLIENTS})
    assert crd_errors(spec) == []
    parsed = parse(spec)
    assert parsed.auth.api_key_secret is not None
    assert (parsed.auth.api_key_secret.name, parsed.auth.api_key_secret.key) == ("chat-keys", "api-key")
    assert parsed.network.clients == tuple(CLIENTS)


def test_without_auth_or_network_nothing_is_asked_and_the_namespace_may_call() -> None:
    parsed = parse(f.spec())
    assert parsed.auth.api_key_secret is None and parsed.network.clients is None


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"auth": {"apiKeySecretRef": {"name": "chat-keys"}}}, "spec.auth.apiKeySecretRef"),
        ({"auth": {"apiKeySecretRef": {"key": "api-key"}}}, "spec.auth.apiKeySecretRef"),
        ({"auth": {"apiKeySecretRef": {"name": "k", "key": "a/b"}}}, "spec.auth.apiKeySecretRef.key"),
        ({"auth": {"apiKey": "sk-literal"}}, "spec.auth"),
        ({"network": {"clients": []}}, "spec.network.clients"),
        ({"network": {"clients": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}}, "spec.network.clients.0"),
        (
            {"network": {"clients": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}]}},
            "spec.network.clients.0.podSelector.matchExpressions.0.operator",
        ),
    ],
)
def test_the_schema_refuses_malformed_auth_and_network(extra: dict[str, Any], where: str) -> None:
    found = crd_errors(f.spec(**extra))
    assert any(e.startswith(where) for e in found), found


@pytest.mark.parametrize(
    "extra",
    [
        {"auth": {"apiKeySecretRef": {"name": "", "key": "api-key"}}},
        {"auth": {"apiKeySecretRef": {"name": "chat-keys"}}},
        {"auth": "chat-keys"},
        {"network": {"clients": []}},
        {"network": {"clients": [{}]}},  # a CEL rule on the API server
        {"network": {"clients": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}},
        {"network": {"clients": [{"podSelector": "app=x"}]}},
    ],
)
def test_the_operator_refuses_what_the_schema_or_cel_would(extra: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        parse(f.spec(**extra))


# --- the builders -----------------------------------------------------------------------------------------


def test_the_key_reaches_every_target_as_env_from_the_secret_never_in_args() -> None:
    state = apikey.inspect(parse(f.spec(auth=AUTH)).auth, secret())
    objs = children.desired(f.OWNER, parse(f.spec(auth=AUTH)), IMAGES, api_key=state)
    sets = target_sets(objs)
    assert len(sets) == 2
    for sts in sets:
        main = container(sts)
        env = [e for e in main["env"] if e["name"] == "STARSD_API_KEY"]
        assert env == [
            {
                "name": "STARSD_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": "chat-keys", "key": "api-key", "optional": False}},
            }
        ]
        assert not any("api-key" in arg for arg in main["command"] + main.get("args", []))
        assert sts["spec"]["template"]["metadata"]["annotations"][apikey.ANNOTATION_DIGEST] == state.digest
    rendered = json.dumps(objs)
    assert KEY not in rendered and base64.b64encode(KEY.encode()).decode() not in rendered
    draft = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "chat-draft")
    assert "STARSD_API_KEY" not in json.dumps(draft)  # the draft is called by the targets only


def test_without_auth_the_targets_get_no_key_and_no_digest() -> None:
    for sts in target_sets(children.desired(f.OWNER, parse(f.spec()), IMAGES)):
        assert all(e["name"] != "STARSD_API_KEY" for e in container(sts)["env"])
        assert apikey.ANNOTATION_DIGEST not in (sts["spec"]["template"]["metadata"].get("annotations") or {})


def test_the_digest_follows_the_keys_value_only() -> None:
    auth = parse(f.spec(auth=AUTH)).auth
    first = apikey.inspect(auth, secret()).digest
    assert first is not None and KEY not in first and len(first) == 16
    assert apikey.inspect(auth, secret(team="ml")).digest == first  # metadata only: no roll
    assert apikey.inspect(auth, secret(KEY + ",sk-next-key")).digest != first  # a new key: a roll
    assert apikey.inspect(auth, secret(uid="recreated")).digest != first


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (None, apikey.SECRET_NOT_FOUND),
        (secret(key="other"), apikey.KEY_NOT_FOUND),
        (secret(""), apikey.KEY_EMPTY),
        (secret(" ,\n"), apikey.KEY_EMPTY),
        (secret(), apikey.FOUND),
    ],
)
def test_the_secrets_state(found: dict[str, Any] | None, reason: str) -> None:
    state = apikey.inspect(parse(f.spec(auth=AUTH)).auth, found)
    assert state.reason == reason
    assert (state.digest is not None) == (reason == apikey.FOUND)


def test_the_target_policy_selects_every_target_pod_and_lets_in_the_listed_clients_on_http() -> None:
    spec = parse(f.spec(network={"clients": CLIENTS}))
    policy = network.target_policy(f.OWNER, spec.network)
    assert policy["metadata"]["name"] == "chat-target"
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for sts in target_sets(children.desired(f.OWNER, spec, IMAGES)):
        assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    draft_labels = naming.labels(f.OWNER, c.COMPONENT_DRAFT)
    assert not selector.items() <= draft_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": CLIENTS, "ports": [{"protocol": "TCP", "port": 8000}]}]


def test_by_default_only_pods_of_the_clusters_namespace_reach_the_targets() -> None:
    policy = network.target_policy(f.OWNER, parse(f.spec()).network)
    assert policy["metadata"]["namespace"] == f.OWNER.namespace
    # A bare podSelector in a NetworkPolicy peer selects pods of the policy's own namespace.
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8000}]}]


def test_the_draft_policy_stays() -> None:
    kinds = [(o["kind"], o["metadata"]["name"]) for o in children.desired(f.OWNER, parse(f.spec()), IMAGES)]
    assert ("NetworkPolicy", "chat-draft") in kinds and ("NetworkPolicy", "chat-target") in kinds


# --- the controller ---------------------------------------------------------------------------------------


def conditions(result: controller.TickResult) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in result.status_patch.get("conditions", [])}


def no_load(_: str) -> Any:
    raise LoadUnavailable("no draft here")


def applied_body(kube: FakeKube, spec: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """Reconcile ``spec`` and return the body as the API server would hold it afterwards."""
    memory = Memory()
    body = f.body(spec, generation=generation)
    controller.reconcile(kube, body, CONFIG, memory)
    kube.settle()
    body["status"]["observedGeneration"] = generation
    return body


def test_a_missing_secret_shows_in_auth_ready_and_ready() -> None:
    kube = FakeKube()
    body = applied_body(kube, f.spec(auth=AUTH))
    result = controller.tick(kube, body, CONFIG, Memory(), now=NOW, fetch=no_load)
    auth = conditions(result)["AuthReady"]
    assert (auth["status"], auth["reason"]) == ("False", apikey.SECRET_NOT_FOUND)
    assert "chat-keys" in auth["message"] and "does not exist" in auth["message"]
    ready = conditions(result)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", apikey.SECRET_NOT_FOUND)
    # The children are there all the same: the pods wait for the Secret rather than start open.
    assert ("StatefulSet", "ml", "chat-target-h100") in kube.objects


def test_the_secret_found_reads_true_and_without_auth_the_condition_says_so() -> None:
    kube = FakeKube()
    kube.put(secret())
    body = applied_body(kube, f.spec(auth=AUTH))
    auth = conditions(controller.tick(kube, body, CONFIG, Memory(), now=NOW, fetch=no_load))["AuthReady"]
    assert (auth["status"], auth["reason"]) == ("True", apikey.FOUND)
    open_body = applied_body(FakeKube(), f.spec())
    auth = conditions(controller.tick(FakeKube(), open_body, CONFIG, Memory(), now=NOW, fetch=no_load))["AuthReady"]
    assert (auth["status"], auth["reason"]) == ("True", apikey.NOT_CONFIGURED)


def test_a_changed_key_rolls_the_first_pool_and_holds_the_next() -> None:
    kube = FakeKube()
    kube.put(secret())
    body = applied_body(kube, f.spec(auth=AUTH))
    h100 = ("StatefulSet", "ml", "chat-target-h100")
    before = copy.deepcopy(kube.objects[h100])
    kube.put(secret(f"sk-new-key-1,{KEY}"))  # the new key first, the old one kept while the pods roll
    controller.tick(kube, body, CONFIG, Memory(), now=NOW, fetch=no_load)
    after = kube.objects[h100]
    hash_key = rollout.ANNOTATION_TEMPLATE_HASH
    assert after["metadata"]["annotations"][hash_key] != before["metadata"]["annotations"][hash_key]
    digest = after["spec"]["template"]["metadata"]["annotations"][apikey.ANNOTATION_DIGEST]
    assert digest != before["spec"]["template"]["metadata"]["annotations"][apikey.ANNOTATION_DIGEST]
    replicas = after["spec"]["replicas"]
    assert after["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == replicas - 1  # one pod at a time
    l4 = kube.objects[("StatefulSet", "ml", "chat-target-l4")]
    assert l4["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == l4["spec"]["replicas"]  # held

    # Another change mid-rollout (no partition moves): the tick still applies the newest key's template.
    kube.put(secret("sk-newer-key-2"))
    controller.tick(kube, body, CONFIG, Memory(), now=NOW, fetch=no_load)
    for name in ("chat-target-h100", "chat-target-l4"):
        newest = kube.objects[("StatefulSet", "ml", name)]["spec"]["template"]["metadata"]["annotations"]
        assert newest[apikey.ANNOTATION_DIGEST] not in (digest, None), name


def test_an_operator_that_may_not_read_secrets_still_reconciles_and_says_it_cannot_tell() -> None:
    kube = FakeKube()
    kube.fail_get = KubeError(403, 'secrets "chat-keys" is forbidden')
    body = applied_body(kube, f.spec(auth=AUTH))
    sts = kube.objects[("StatefulSet", "ml", "chat-target-h100")]
    assert any(e["name"] == "STARSD_API_KEY" for e in container(sts)["env"])
    result = controller.tick(kube, body, CONFIG, Memory(), now=NOW, fetch=no_load)
    auth = conditions(result)["AuthReady"]
    assert (auth["status"], auth["reason"]) == ("Unknown", apikey.UNREADABLE)
    assert conditions(result)["Ready"]["reason"] != apikey.UNREADABLE


def test_another_failure_to_read_the_secret_fails_the_reconcile_rather_than_roll() -> None:
    kube = FakeKube()
    kube.fail_get = KubeError(0, "API server unreachable")
    memory = Memory()
    with pytest.raises(KubeError):
        controller.reconcile(kube, f.body(f.spec(auth=AUTH)), CONFIG, memory)
    assert kube.applied == [] and memory.reconcile_error is not None


def test_the_secret_is_read_by_name_only_when_auth_is_set() -> None:
    kube = FakeKube()
    applied_body(kube, f.spec())
    assert kube.got == []
    kube.put(secret())
    applied_body(kube, f.spec(auth=AUTH))
    assert set(kube.got) == {("Secret", "chat-keys")}
