"""kopf handlers: thin adapters from kopf's calls to :mod:`.controller`.

* ``reconcile`` runs on create, on resume (operator start) and on every spec change: the same idempotent
  server-side apply each time, then ``status.observedGeneration``.
* ``tick`` runs every few seconds per cluster: status from the children, the draft's load, the rebalancer.

Both are sync: kopf runs them in its thread pool, and the client they call is the synchronous one.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

import kopf

from . import constants as c
from . import controller, loadclient
from .controller import Config, Memory
from .kube import Kube, KubeError
from .spec import SpecError

RETRY_DELAY = 10.0
MEMORY_KEY = "starsd_memory"


def register(registry: kopf.OperatorRegistry, *, tick_interval: float) -> None:
    """Register the handlers on ``registry``."""
    # kopf's connection uses the credentials the Kubernetes client loaded (kube.load_config), so the
    # watches and the operator's own requests act as the same identity.
    kopf.on.login(registry=registry, id="login")(kopf.login_via_client)
    g, v, p = c.GROUP, c.VERSION, c.PLURAL
    kopf.on.create(group=g, version=v, plural=p, registry=registry, id="reconcile")(reconcile)
    kopf.on.resume(group=g, version=v, plural=p, registry=registry, id="reconcile")(reconcile)
    kopf.on.update(group=g, version=v, plural=p, field="spec", registry=registry, id="reconcile")(reconcile)
    kopf.timer(group=g, version=v, plural=p, interval=tick_interval, initial_delay=1.0, registry=registry, id="tick")(
        tick
    )


def memory(memo: Any) -> Memory:
    """The per-cluster :class:`Memory`; kopf gives each object its own copy of the operator's memo."""
    found = memo.get(MEMORY_KEY)
    if not isinstance(found, Memory):
        found = memo[MEMORY_KEY] = Memory()
    return found


def post(body: kopf.Body, events: list[controller.Event], logger: Any) -> None:
    """Post each Event on the cluster's object (``kubectl describe ssd`` lists them) and log it."""
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.info(f"{event.reason}: {event.message}")


def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    kube: Kube = memo["kube"]
    config: Config = memo["config"]
    try:
        events = controller.reconcile(kube, body, config, memory(memo))
    except SpecError as exc:
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    except KubeError as exc:
        if exc.permanent:
            raise kopf.PermanentError(f"the API server refused a child: {exc}") from exc
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from exc
    post(body, events, logger)
    patch.status["observedGeneration"] = body.metadata.get("generation")
    images = controller.images_record(kube, body, config)
    if images is not None and images != (body.get("status") or {}).get("images"):
        patch.status["images"] = images


def tick(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    kube: Kube = memo["kube"]
    config: Config = memo["config"]
    fetch = functools.partial(loadclient.fetch, timeout=config.load_timeout)
    try:
        result = controller.tick(kube, body, config, memory(memo), now=datetime.now(UTC), fetch=fetch)
    except KubeError as exc:
        logger.warning(f"cannot observe the cluster's children, trying again next tick: {exc}")
        return
    post(body, result.events, logger)
    if result.status_patch:
        patch.status.update(result.status_patch)
