"""Which default images a cluster's pods run: ``spec.imagePolicy``.

* ``Pinned`` (the default): the images a cluster was first reconciled with are recorded in
  ``status.images`` and kept, so installing a new operator version does not roll every cluster at once;
  a cluster moves when its spec asks (``spec.draft.image`` / ``spec.target.image``, or ``FollowOperator``).
* ``FollowOperator``: the operator's current defaults (``STARSD_DRAFT_IMAGE`` / ``STARSD_TARGET_IMAGE``).

A cluster reconciled by an operator older than the record has no ``status.images``: its running children's
images are taken as the record (a component with a per-cluster override has nothing to pin and takes the
operator's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .podspec import Images

PINNED = "Pinned"
FOLLOW_OPERATOR = "FollowOperator"
POLICIES = (PINNED, FOLLOW_OPERATOR)


def resolve(
    policy: str,
    operator: Images,
    recorded: Mapping[str, Any] | None,
    running: Mapping[str, str | None] | None = None,
) -> Images:
    """The default images for this cluster: the operator's, or (``Pinned``) the recorded ones, else the ones
    its children ``running`` now, else the operator's."""
    if policy == FOLLOW_OPERATOR:
        return operator
    recorded = recorded or {}
    running = running or {}

    def pick(component: str, default: str) -> str:
        value = recorded.get(component) or running.get(component)
        return value if isinstance(value, str) and value else default

    return Images(draft=pick("draft", operator.draft), target=pick("target", operator.target))


def record(images: Images) -> dict[str, str]:
    """``status.images``."""
    return {"draft": images.draft, "target": images.target}


def container_image(workload: Mapping[str, Any] | None) -> str | None:
    """The image of a workload's first container, as the API server holds it."""
    containers = (((workload or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    image = containers[0].get("image") if containers else None
    return image if isinstance(image, str) else None
