"""Level-triggered reconcile: every child compared with its desired state on every pass, what is missing or
drifted applied again with one Repaired Event, what others own left alone."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starsd_operator import children, controller, drift
from starsd_operator import constants as c
from starsd_operator.controller import Config, Memory
from starsd_operator.loadclient import LoadUnavailable
from starsd_operator.podspec import Images
from starsd_operator.rebalancer import Load
from starsd_operator.spec import parse

from . import factories as f
from .fakekube import FakeKube

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = Config()


def no_load(url: str) -> Load:
    raise LoadUnavailable(f"{url}: not served in this test")


def reconciled() -> tuple[FakeKube, Memory, dict[str, Any]]:
    body = f.body()
    kube, memory = FakeKube(), Memory()
    controller.reconcile(kube, body, CONFIG, memory, now=T0.timestamp())
    kube.settle()
    body["status"]["observedGeneration"] = body["metadata"]["generation"]
    return kube, memory, body


def repaired(kube: FakeKube, memory: Memory, body: dict[str, Any], after: float = 10) -> list[str]:
    """One tick ``after`` seconds on; the messages of its Repaired Events."""
    result = controller.tick(kube, body, CONFIG, memory, now=T0 + timedelta(seconds=after), fetch=no_load)
    return [e.message for e in result.events if e.reason == c.EVENT_REPAIRED and e.type == "Normal"]


def every_child() -> list[tuple[str, str]]:
    objs = children.desired(f.OWNER, parse(f.spec()), Images())
    return [(o["kind"], o["metadata"]["name"]) for o in objs]


@pytest.mark.parametrize("kind,name", every_child())
def test_each_deleted_child_comes_back_with_its_event(kind: str, name: str) -> None:
    kube, memory, body = reconciled()
    kube.delete(kind, "ml", name)
    kube.applied.clear()
    assert repaired(kube, memory, body) == [f"{kind} {name} was missing"]
    assert kube.applied == [(kind, name)]  # only the missing one is applied again
    assert (kind, "ml", name) in kube.objects


def test_a_healthy_cluster_applies_nothing_pass_after_pass() -> None:
    kube, memory, body = reconciled()
    kube.applied.clear()
    for second in (10, 20, 30):
        assert repaired(kube, memory, body, after=second) == []
        kube.settle()  # controllers keep writing the status: a new resourceVersion, still no drift
    assert kube.applied == []


def test_a_pool_scaled_by_hand_is_scaled_back() -> None:
    kube, memory, body = reconciled()
    kube.edit("StatefulSet", "ml", "chat-target-h100", lambda o: o["spec"].update(replicas=99))
    assert repaired(kube, memory, body) == ["StatefulSet chat-target-h100 drifted: spec.replicas"]
    assert kube.objects[("StatefulSet", "ml", "chat-target-h100")]["spec"]["replicas"] == 2


def test_a_hand_edited_image_and_args_are_restored() -> None:
    kube, memory, body = reconciled()
    key = ("StatefulSet", "ml", "chat-target-l4")
    image = kube.objects[key]["spec"]["template"]["spec"]["containers"][0]["image"]

    def edit(obj: dict[str, Any]) -> None:
        container = obj["spec"]["template"]["spec"]["containers"][0]
        container["image"] = "evil/target:latest"
        container["command"] = [*container["command"], "--gamma", "1"]

    kube.edit(*key, edit)
    [message] = repaired(kube, memory, body)
    assert message.startswith("StatefulSet chat-target-l4 drifted: ")
    assert "spec.template.spec.containers[target].image" in message
    assert "spec.template.spec.containers[target].command" in message
    container = kube.objects[key]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image and "evil" not in container["image"]
    assert container["command"][-2:] != ["--gamma", "1"]


def test_a_removed_label_is_restored_and_an_added_one_is_left() -> None:
    kube, memory, body = reconciled()

    def relabel(obj: dict[str, Any]) -> None:
        del obj["metadata"]["labels"][c.LABEL_COMPONENT]
        obj["metadata"]["labels"]["team"] = "ml"  # someone else's label: not the operator's field

    kube.edit("Service", "ml", "chat-draft", relabel)
    assert repaired(kube, memory, body) == [f"Service chat-draft drifted: metadata.labels.{c.LABEL_COMPONENT}"]
    labels = kube.objects[("Service", "ml", "chat-draft")]["metadata"]["labels"]
    assert labels[c.LABEL_COMPONENT] == "draft" and labels["team"] == "ml"


def test_fields_others_own_are_not_drift() -> None:
    kube, memory, body = reconciled()

    def others(obj: dict[str, Any]) -> None:
        obj["spec"]["clusterIP"] = "10.0.0.7"  # filled in by the API server
        obj["metadata"].setdefault("annotations", {})["note"] = "kept"
        obj["spec"]["ports"].append({"name": "debug", "port": 9999})  # another manager's entry

    kube.edit("Service", "ml", "chat", others)
    kube.applied.clear()
    assert repaired(kube, memory, body) == []
    assert kube.applied == []


def test_a_value_the_api_server_normalises_is_applied_once_without_an_event() -> None:
    kube, memory, body = reconciled()
    key = ("PodDisruptionBudget", "ml", "chat-draft")
    kube.edit(*key, lambda o: o["spec"].update(maxUnavailable="1"))  # an int-or-string, as returned
    kube.applied.clear()
    assert repaired(kube, memory, body) == []  # "1" is 1
    assert kube.applied == []


def test_an_apply_the_api_server_keeps_as_it_was_posts_no_event_and_is_not_repeated() -> None:
    """A value the API server normalises (a quantity, say) differs from the desired one after every apply."""
    kube, memory, body = reconciled()
    key = ("Service", "ml", "chat")
    kube.edit(*key, lambda o: o["spec"].update(type="ClusterIP "))  # as if the server wrote it back so
    kept: list[str] = []

    def unchanged(obj: Any) -> dict[str, Any]:  # the server's normalised form: nothing changes
        kept.append(obj["metadata"]["name"])
        return dict(kube.objects[key])

    kube.apply = unchanged  # type: ignore[method-assign]
    assert repaired(kube, memory, body) == []
    assert kept == ["chat"]
    kube.settle()
    assert repaired(kube, memory, body, after=20) == []
    assert kept == ["chat"]  # the same difference after an apply that changed nothing: not applied again


def test_no_repair_while_the_watch_has_not_seen_the_operators_own_write() -> None:
    kube, memory, body = reconciled()
    kube.delete("Service", "ml", "chat")
    assert repaired(kube, memory, body, after=1) == []  # applied a second ago: the watch lags, not a deletion
    assert repaired(kube, memory, body, after=5) == ["Service chat was missing"]


def test_a_deletion_the_watch_saw_is_repaired_even_right_after_the_operators_own_write() -> None:
    kube, memory, body = reconciled()
    kube.delete("Service", "ml", "chat")
    memory.deleted.add(("Service", "chat"))  # what handlers.child_changed records on a DELETED event
    assert repaired(kube, memory, body, after=1) == ["Service chat was missing"]
    assert memory.deleted == set()


def test_a_rollout_step_moves_the_partition_without_a_repaired_event() -> None:
    kube, memory, body = reconciled()
    kube.edit(
        "StatefulSet",
        "ml",
        "chat-target-h100",
        lambda o: o["spec"]["updateStrategy"]["rollingUpdate"].update(partition=2),
    )
    kube.applied.clear()
    assert repaired(kube, memory, body) == []
    assert kube.applied == [("StatefulSet", "chat-target-h100")]


def test_differences_match_lists_by_merge_key_and_plain_lists_whole() -> None:
    desired = {"spec": {"ports": [{"name": "http", "port": 80}], "args": ["a", "b"], "selector": {}}}
    assert (
        drift.differences(
            desired, {"spec": {"ports": [{"port": 81, "name": "x"}, {"name": "http", "port": 80}], "args": ["a", "b"]}}
        )
        == []
    )
    assert drift.differences(desired, {"spec": {"ports": [], "args": ["a"]}}) == ["spec.ports[http]", "spec.args"]
    assert drift.differences({"a": 1}, {"a": "1"}) == [] and drift.differences({"a": 1}, {"a": 2}) == ["a"]
    assert drift.differences({"a": True}, {"a": "True"}) == ["a"]
    assert drift.differences({"minReadySeconds": 0, "paused": False}, {}) == []  # omitempty
    assert drift.differences({"replicas": 2}, {}) == ["replicas"]


def test_a_hand_scale_right_after_the_operators_own_write_is_repaired_at_once() -> None:
    kube, memory, body = reconciled()
    assert repaired(kube, memory, body, after=10) == []
    kube.edit("StatefulSet", "ml", "chat-target-h100", lambda o: o["spec"].update(replicas=99))
    assert repaired(kube, memory, body, after=10.5) == ["StatefulSet chat-target-h100 drifted: spec.replicas"]
    kube.edit("StatefulSet", "ml", "chat-target-h100", lambda o: o["spec"].update(replicas=99))
    assert repaired(kube, memory, body, after=11) == ["StatefulSet chat-target-h100 drifted: spec.replicas"]


def test_a_watched_copy_older_than_the_operators_own_write_posts_no_event() -> None:
    """The watch lags: the pass still sees the drift the operator has just repaired."""
    kube, memory, body = reconciled()
    key = ("StatefulSet", "ml", "chat-target-h100")
    kube.edit(*key, lambda o: o["spec"].update(replicas=99))
    stale = copy.deepcopy(kube.objects[key])
    assert repaired(kube, memory, body, after=10) == ["StatefulSet chat-target-h100 drifted: spec.replicas"]
    fresh = kube.objects[key]
    kube.objects[key] = stale  # what the watch still holds
    original = kube.apply

    def server(obj: Any) -> dict[str, Any]:  # the API server holds the repaired object: the apply changes nothing
        kube.objects[key] = fresh
        return original(obj)

    kube.apply = server  # type: ignore[method-assign]
    assert repaired(kube, memory, body, after=10.5) == []
    assert kube.objects[key]["spec"]["replicas"] == 2
