"""Parsing a spec: defaults, and a clear field path for what the operator cannot act on."""

from __future__ import annotations

from typing import Any

import pytest
from starsd_operator.modelsource import ClaimSource
from starsd_operator.spec import AutoscalingSpec, ModelSource, SpecError, parse

from . import factories as f


def test_a_minimal_spec_gets_the_defaults() -> None:
    parsed = parse({"draft": {"model": {"path": "/d"}}, "target": {"model": {"path": "/t"}}, "pools": [{"name": "a"}]})
    assert parsed.replicas == 1
    assert parsed.target.gamma == 4
    assert parsed.draft.image is None and parsed.target.image is None
    [pool] = parsed.pools
    assert (pool.weight, pool.min_replicas, pool.max_replicas) == (1, 0, 64)
    assert parsed.autoscaling == AutoscalingSpec()
    assert parsed.autoscaling.enabled is False


def test_models_in_the_image_on_a_claim_or_at_a_uri() -> None:
    parsed = parse(f.spec(draft={"model": {"pvc": {"claimName": "c", "subPath": "d"}}}))
    assert parsed.draft.model == ModelSource(pvc=ClaimSource(claim_name="c", sub_path="d", read_only=True))
    assert parse(f.spec()).target.model == ModelSource(path="/models/target")
    uri = {"uri": "hf://o/n@v1", "credentials": {"secretRef": {"name": "hf"}}, "cache": {"claimName": "cache"}}
    assert parse(f.spec(target={"model": uri})).target.model == ModelSource(
        uri="hf://o/n@v1", secret_name="hf", cache_claim="cache"
    )


def test_a_pool_may_override_the_target_model() -> None:
    parsed = parse(f.spec(pools=[{"name": "a", "model": {"uri": "s3://bucket/int8"}}, {"name": "b"}]))
    assert parsed.pools[0].model == ModelSource(uri="s3://bucket/int8")
    assert parsed.pools[1].model is None


def test_placement_is_copied() -> None:
    tolerations = [{"key": "k", "operator": "Exists"}]
    parsed = parse(
        f.spec(
            pools=[
                {
                    "name": "a",
                    "nodeSelector": {"pool": "a"},
                    "tolerations": tolerations,
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ]
        )
    )
    placement = parsed.pools[0].placement
    assert placement.node_selector == {"pool": "a"}
    assert placement.tolerations == tolerations and placement.tolerations is not tolerations
    assert placement.resources == {"limits": {"nvidia.com/gpu": 1}}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"draft": None}, "spec.draft"),
        ({"target": {"model": {"path": "relative"}}}, "spec.target.model.path"),
        ({"target": {"model": {}}}, "spec.target.model needs exactly one source"),
        ({"target": {"model": {"path": "/t", "uri": "hf://o/n"}}}, "spec.target.model needs exactly one source"),
        ({"target": {"model": {"uri": "ftp://x/y"}}}, "spec.target.model.uri: 'ftp://x/y': the scheme 'ftp'"),
        ({"target": {"model": {"uri": "hf://only-name"}}}, "spec.target.model.uri"),
        ({"target": {"model": {"path": "/t", "cache": {"claimName": "c"}}}}, "spec.target.model.cache"),
        ({"target": {"model": {"uri": "hf://o/n", "cache": {}}}}, "spec.target.model.cache.claimName"),
        ({"target": {"model": {"uri": "hf://o/n", "credentials": {}}}}, "spec.target.model.credentials.secretRef"),
        ({"target": {"model": {"pvc": {"subPath": "x"}}}}, "spec.target.model.pvc.claimName"),
        ({"target": {"model": {"pvc": {"claimName": "c", "subPath": "../x"}}}}, "spec.target.model.pvc.subPath"),
        ({"pools": [{"name": "a", "model": {"uri": "gs://B/x"}}]}, "spec.pools[0].model.uri"),
        ({"target": {"model": {"path": "/t"}, "gamma": 0}}, "spec.target.gamma"),
        ({"target": {"model": {"path": "/t"}, "gamma": 17}}, "spec.target.gamma"),
        ({"target": {"model": {"path": "/t"}, "gamma": True}}, "spec.target.gamma"),
        ({"pools": []}, "spec.pools"),
        ({"pools": [{"name": "a"}, {"name": "a"}]}, "spec.pools"),
        ({"pools": [{"name": "a", "minReplicas": 3, "maxReplicas": 2}]}, "spec.pools[0]"),
        ({"pools": [{"weight": 1}]}, "spec.pools[0].name"),
        ({"targets": {"replicas": -1}}, "spec.targets.replicas"),
        ({"autoscaling": {"minTargets": 4, "maxTargets": 2}}, "spec.autoscaling"),
        ({"autoscaling": {"scaleUp": {"maxStep": 0}}}, "spec.autoscaling.scaleUp.maxStep"),
        ({"autoscaling": {"scaleDown": {"policies": [{"type": "Pods", "value": 0}]}}}, "policies[0].value"),
        ({"autoscaling": {"scaleDown": {"selectPolicy": "Sometimes"}}}, "scaleDown.selectPolicy"),
        ({"autoscaling": {"scaleInOccupancy": 0.9, "saturatedOccupancy": 0.5}}, "scaleInOccupancy"),
        ({"autoscaling": {"enabled": "yes"}}, "spec.autoscaling.enabled"),
        ({"draft": {"model": {"path": "/d", "pvc": {"claimName": "c"}}}}, "spec.draft.model needs exactly one"),
        ({"draft": {"model": {"path": "/d"}, "nodeSelector": {"a": 1}}}, "spec.draft.nodeSelector"),
        ({"draft": {"model": {"path": "/d"}, "replicas": 0}}, "spec.draft.replicas must be >= 1, got 0"),
        ({"draft": {"model": {"path": "/d"}, "replicas": 33}}, "spec.draft.replicas must be in 1..32, got 33"),
        ({"draft": {"model": {"path": "/d"}, "replicas": "3"}}, "spec.draft.replicas must be an integer"),
        ({"autoscaling": {"minDrafts": 0}}, "spec.autoscaling.minDrafts must be >= 1"),
        ({"autoscaling": {"maxDrafts": 40}}, "spec.autoscaling.maxDrafts must be <= 32, got 40"),
        ({"autoscaling": {"minDrafts": 3, "maxDrafts": 2}}, "spec.autoscaling: minDrafts .3. must be <= maxDrafts .2."),
        (
            {"draft": {"model": {"path": "/d"}, "replicas": 3}, "autoscaling": {"enabled": True, "maxDrafts": 2}},
            "spec.draft.replicas .3. must be within spec.autoscaling.minDrafts..maxDrafts .1..2.",
        ),
    ],
)
def test_errors_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse(f.spec(**overrides))


def test_the_draft_count_and_its_bounds() -> None:
    assert parse(f.spec()).draft.replicas == 1
    assert (AutoscalingSpec().min_drafts, AutoscalingSpec().max_drafts) == (1, 1)
    parsed = parse(
        f.spec(
            draft={"model": {"path": "/d"}, "replicas": 3},
            autoscaling={"enabled": True, "minDrafts": 2, "maxDrafts": 4},
        )
    )
    assert parsed.draft.replicas == 3
    assert (parsed.autoscaling.min_drafts, parsed.autoscaling.max_drafts) == (2, 4)
    # Without autoscaling the bounds do not constrain the count (as minTargets/maxTargets).
    assert parse(f.spec(draft={"model": {"path": "/d"}, "replicas": 5})).draft.replicas == 5


def test_min_targets_zero_is_refused_with_why() -> None:
    from starsd_operator import spec as specmod

    raw = f.spec(autoscaling={"enabled": True, "minTargets": 0, "maxTargets": 4})
    with pytest.raises(specmod.SpecError, match="minTargets must be at least 1: with no target, nothing reports"):
        specmod.parse(raw)
