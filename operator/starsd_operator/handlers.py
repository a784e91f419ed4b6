"""kopf handlers: thin adapters from kopf's calls to :mod:`.controller`.

* ``reconcile`` runs on create, on resume (operator start) and on every spec change: the same idempotent
  server-side apply each time, then ``status.observedGeneration``.
* ``tick`` runs every few seconds per cluster: the repair pass, status from the children, the draft's load,
  the rebalancer (the safety net of level-triggering, and the rebalancer's clock).
* The children are watched (kopf indices, by the operator's ``managed-by`` label): the passes read them from
  memory instead of listing them, and a change to one (a deletion, a hand edit) triggers a repair pass of its
  cluster within a second.

Every pass of one cluster runs alone and on the newest body (:mod:`.clusters`), in a worker thread: the
controller and the Kubernetes client are synchronous.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from . import constants as c
from . import controller, loadclient, metrics
from .clusters import Clusters, Key, key_of
from .controller import Config, Memory
from .kube import Kube, KubeError, Watched
from .rebalancer import Load
from .spec import SpecError

RETRY_DELAY = 10.0
CLUSTERS_KEY = "starsd_clusters"


@dataclass(frozen=True)
class WatchedKind:
    """A kind the operator watches: read from memory by the passes; ``repairs``: a change triggers a pass."""

    kind: str
    group: str
    version: str
    plural: str
    repairs: bool = True

    @property
    def index(self) -> str:
        return f"watched_{self.plural}"


# Every kind the controller lists. A new child kind is one more row (and its verbs in permissions.py).
WATCHED = (
    WatchedKind("Service", "", "v1", "services"),
    WatchedKind("StatefulSet", "apps", "v1", "statefulsets"),
    WatchedKind("Deployment", "apps", "v1", "deployments"),
    WatchedKind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
    WatchedKind("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies"),
    WatchedKind("Pod", "", "v1", "pods", repairs=False),
    WatchedKind("HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers", repairs=False),
)
OWNED = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


def register(registry: kopf.OperatorRegistry, *, tick_interval: float) -> None:
    """Register the handlers on ``registry``."""
    # kopf's connection uses the credentials the Kubernetes client loaded (kube.load_config), so the
    # watches and the operator's own requests act as the same identity.
    kopf.on.login(registry=registry, id="login")(kopf.login_via_client)
    g, v, p = c.GROUP, c.VERSION, c.PLURAL
    kopf.on.create(group=g, version=v, plural=p, registry=registry, id="reconcile")(reconcile)
    kopf.on.resume(group=g, version=v, plural=p, registry=registry, id="reconcile")(reconcile)
    kopf.on.update(group=g, version=v, plural=p, field="spec", registry=registry, id="reconcile")(reconcile)
    kopf.on.event(group=g, version=v, plural=p, registry=registry, id="seen")(seen)
    kopf.timer(group=g, version=v, plural=p, interval=tick_interval, initial_delay=1.0, registry=registry, id="tick")(
        tick
    )
    for w in WATCHED:
        where: dict[str, Any] = {"group": w.group, "version": w.version, "plural": w.plural, "registry": registry}
        if w.kind == "HorizontalPodAutoscaler":  # the user's, unlabelled: only those that scale a cluster
            kopf.index(**where, id=w.index, when=_scales_a_cluster)(by_namespace)
        else:
            kopf.index(**where, id=w.index, labels=OWNED)(by_namespace)
        if w.repairs:
            kopf.on.event(**where, id=f"changed_{w.plural}", labels=OWNED)(child_changed)


def by_namespace(namespace: str | None, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    """The index: namespace -> the objects, as plain dicts (kopf drops an object's entry when it is deleted)."""
    return {str(namespace): copy.deepcopy(dict(body))}


def _scales_a_cluster(spec: kopf.Spec, **_: Any) -> bool:
    ref = spec.get("scaleTargetRef") or {}
    return bool(ref.get("kind") == c.KIND and str(ref.get("apiVersion") or "").split("/")[0] == c.GROUP)


def clusters(memo: Any) -> Clusters:
    """The operator's :class:`Clusters` (kopf gives each object a shallow copy of the operator's memo, so one
    object stored at startup is shared)."""
    found = memo.get(CLUSTERS_KEY)
    if not isinstance(found, Clusters):
        found = memo[CLUSTERS_KEY] = Clusters()
    return found


def watched(memo: Any, kwargs: Mapping[str, Any]) -> Kube:
    """The API client whose lists of the watched kinds read kopf's indices (what the handler was given)."""
    stores: dict[str, Callable[[str], Iterable[Mapping[str, Any]]]] = {}
    for w in WATCHED:
        index = kwargs.get(w.index)
        if index is not None:
            stores[w.kind] = _reader(index)
    kube: Kube = memo["kube"]
    return Watched(kube, stores) if stores else kube


def _reader(index: Any) -> Callable[[str], Iterable[Mapping[str, Any]]]:
    def read(namespace: str) -> Iterable[Mapping[str, Any]]:
        return list(index.get(namespace, ()))

    return read


def post(body: Mapping[str, Any], events: list[controller.Event], logger: Any) -> None:
    """Post each Event on the cluster's object (``kubectl describe ssd`` lists them) and log it."""
    for event in events:
        kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message)
        logger.info(f"{event.reason}: {event.message}")
        if event.reason == c.EVENT_REPAIRED:
            metrics.REPAIRS.labels(kind=event.message.split(" ", 1)[0]).inc()


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


async def seen(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Every watch event of a cluster: the newest body, for the passes that start later."""
    if type == "DELETED":
        clusters(memo).gone(key_of(body))
    else:
        clusters(memo).seen(_plain(body))


async def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    config: Config = memo["config"]
    kube = watched(memo, kwargs)
    registry = clusters(memo)

    def work(current: Mapping[str, Any], memory: Memory) -> tuple[list[controller.Event], dict[str, str] | None, Any]:
        events = controller.reconcile(kube, current, config, memory)
        generation = (current.get("metadata") or {}).get("generation")
        return events, controller.images_record(kube, current, config), generation

    metrics.RECONCILES.labels(handler="reconcile").inc()
    try:
        done = await registry.exclusive(key_of(body), _plain(body), work)
    except SpecError as exc:
        metrics.ERRORS.labels(where="reconcile").inc()
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    except KubeError as exc:
        metrics.ERRORS.labels(where="reconcile").inc()
        if exc.permanent:
            raise kopf.PermanentError(f"the API server refused a child: {exc}") from exc
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY) from exc
    if done is None:
        return
    events, images, generation = done
    post(body, events, logger)
    patch.status["observedGeneration"] = generation  # of the body applied: the newest known, maybe past kopf's
    if images is not None and images != (body.get("status") or {}).get("images"):
        patch.status["images"] = images


async def tick(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any, **kwargs: Any) -> None:
    config: Config = memo["config"]
    kube = watched(memo, kwargs)
    registry = clusters(memo)
    fetch = _fetcher(config)
    started = time.monotonic()

    def work(current: Mapping[str, Any], memory: Memory) -> controller.TickResult:
        return controller.tick(kube, current, config, memory, now=datetime.now(UTC), fetch=fetch)

    key = key_of(body)
    metrics.RECONCILES.labels(handler="tick").inc()
    try:
        result = await registry.exclusive(key, _plain(body), work)
    except KubeError as exc:
        metrics.ERRORS.labels(where="tick").inc()
        logger.warning(f"cannot observe the cluster's children, trying again next tick: {exc}")
        return
    finally:
        metrics.TICK_SECONDS.observe(time.monotonic() - started)
    if result is None:
        return
    post(body, result.events, logger)
    if result.decision_reason:
        metrics.DECISIONS.labels(reason=result.decision_reason).inc()
    if result.status_patch:
        metrics.STATUS_WRITES.inc()
        patch.status.update(result.status_patch)


def _fetcher(config: Config) -> controller.Fetch:
    def fetch(url: str) -> Load:
        return loadclient.fetch(url, timeout=config.load_timeout)

    return fetch


async def child_changed(
    body: kopf.Body,
    type: str | None,
    labels: Mapping[str, str],
    namespace: str | None,
    memo: kopf.Memo,
    logger: Any,
    **kwargs: Any,
) -> None:
    """A watched child changed or went away: a repair pass of its cluster soon (see :meth:`Clusters.poke`)."""
    name = labels.get(c.LABEL_INSTANCE)
    if not name or namespace is None:
        return
    registry = clusters(memo)
    if type == "DELETED":  # missing for sure, even right after the operator's own write
        registry.memory((namespace, name)).deleted.add((str(body.get("kind")), str(body.metadata.name)))
    config: Config = memo["config"]
    kube = watched(memo, kwargs)

    async def repair(key: Key) -> None:
        def work(current: Mapping[str, Any], memory: Memory) -> list[controller.Event]:
            return controller.converge(kube, current, config, memory, now=time.time())

        events = await registry.exclusive(key, None, work)
        body = registry.latest(key)
        if events and body is not None:
            post(body, events, logger)

    registry.poke((namespace, name), repair)
