"""Every child resource of a cluster, as the plain dicts the operator applies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import apikey, disruption, draft, network, pools, targets
from .naming import Owner
from .podspec import Images
from .spec import ClusterSpec


def desired(
    owner: Owner,
    spec: ClusterSpec,
    images: Images,
    partitions: Mapping[str, int] | None = None,
    api_key: apikey.KeyState | None = None,
) -> list[dict[str, Any]]:
    """The draft's Deployment, its headless and ClusterIP Services, NetworkPolicy and PodDisruptionBudget, per
    pool a StatefulSet, headless Service and (with replicas) PodDisruptionBudget, and the client Service and
    the targets' NetworkPolicy;
    Services come before the workloads that use their names. ``partitions`` holds each pool's StatefulSet partition (see
    :mod:`.rollout`; 0 when absent), ``api_key`` what the operator found of the API key's Secret (its
    digest in the target pods' template rolls the pools when the key changes; see :mod:`.apikey`).

    A pod template that asks for the star's own fields raises :class:`SpecError` (a ``TemplateError``) naming
    the field."""
    partitions = partitions or {}
    split = pools.split(spec.replicas, spec.pools)
    objs: list[dict[str, Any]] = [
        draft.service(owner),
        draft.headless_service(owner),
        network.draft_policy(owner),
        draft.deployment(owner, spec, images),
        targets.client_service(owner),
        network.target_policy(owner, spec.network),
    ]
    objs.append(disruption.draft_budget(owner, spec.draft.disruption))
    for pool in spec.pools:
        objs.append(targets.headless_service(owner, pool))
        objs.append(
            targets.statefulset(
                owner, spec, pool, split[pool.name], images, partitions.get(pool.name, 0), api_key=api_key
            )
        )
        if split[pool.name] > 0:  # none over no pods; the reconcile deletes one left from before
            objs.append(disruption.pool_budget(owner, pool.name, pool.disruption))
    return objs
