"""PodDisruptionBudgets: one for the draft, one per pool with replicas, selecting exactly that workload's pods."""

from __future__ import annotations

from typing import Any

import pytest
from starsd_operator import children
from starsd_operator.podspec import Images
from starsd_operator.spec import SpecError, parse

from starsd import defaults

from . import factories as f

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")


def budgets(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objs = children.desired(f.OWNER, parse(spec), IMAGES)
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodDisruptionBudget"}


def test_the_draft_and_each_pool_get_a_budget_selecting_their_own_pods() -> None:
    objs = children.desired(f.OWNER, parse(f.spec()), IMAGES)
    found = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodDisruptionBudget"}
    workloads = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", "StatefulSet")}
    assert set(found) == set(workloads) == {"chat-draft", "chat-target-h100", "chat-target-l4"}
    for name, pdb in found.items():
        assert pdb["apiVersion"] == "policy/v1"
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"] == workloads[name]["spec"]["selector"]
        assert pdb["metadata"]["ownerReferences"][0]["uid"] == f.OWNER.uid


def test_max_unavailable_is_configurable_per_pool_and_for_the_draft() -> None:
    spec = f.spec(
        draft={"model": {"path": "/d"}, "disruption": {"maxUnavailable": 2}},
        pools=[{"name": "h100", "disruption": {"maxUnavailable": "25%"}}, {"name": "l4"}],
    )
    found = budgets(spec)
    assert found["chat-draft"]["spec"]["maxUnavailable"] == 2
    assert found["chat-target-h100"]["spec"]["maxUnavailable"] == "25%"
    assert found["chat-target-l4"]["spec"]["maxUnavailable"] == defaults.MAX_UNAVAILABLE


def test_a_pool_without_replicas_has_no_budget() -> None:
    found = budgets(f.spec(targets={"replicas": 0}))
    assert set(found) == {"chat-draft"}


@pytest.mark.parametrize("value", [0, -1, "0%", "101%", "half", True, 1.5])
def test_a_bad_max_unavailable_is_named(value: Any) -> None:
    with pytest.raises(SpecError, match=r"spec\.pools\[0\]\.disruption\.maxUnavailable"):
        parse(f.spec(pools=[{"name": "a", "disruption": {"maxUnavailable": value}}]))


@pytest.mark.parametrize("drafts", [1, 3])
def test_the_draft_budget_covers_every_draft_pod_and_evicts_one_at_a_time(drafts: int) -> None:
    """With several drafts a drain takes one at a time: its targets move to the others meanwhile."""
    objs = children.desired(f.OWNER, parse(f.spec(draft={"model": {"path": "/d"}, "replicas": drafts})), IMAGES)
    [sts] = [o for o in objs if (o["kind"], o["metadata"]["name"]) == ("Deployment", "chat-draft")]
    [pdb] = [o for o in objs if (o["kind"], o["metadata"]["name"]) == ("PodDisruptionBudget", "chat-draft")]
    assert sts["spec"]["replicas"] == drafts
    assert pdb["spec"]["maxUnavailable"] == defaults.MAX_UNAVAILABLE == 1
    # The budget selects exactly the StatefulSet's pods (every ordinal carries the template's labels).
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
