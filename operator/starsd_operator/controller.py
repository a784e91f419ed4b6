"""One reconcile and one periodic tick of a cluster, with the API server and the clock passed in.

:func:`reconcile` makes the children match the spec (create, resume and update all run it). :func:`tick`
observes the children and the draft's load, lets the rebalancer decide, and returns the status patch and the
Events to post; kopf's handlers (:mod:`.handlers`) only adapt these to kopf.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from . import children, conditions, loadclient, naming, pools, rebalancer, status
from . import constants as c
from .kube import Kube, KubeError
from .naming import Owner
from .podspec import Images
from .rebalancer import Decision, Load, Sample
from .spec import ClusterSpec, SpecError, parse

log = logging.getLogger(__name__)

Fetch = Callable[[str], Load]


@dataclass(frozen=True)
class Config:
    """Operator-wide settings."""

    images: Images = field(default_factory=Images)
    load_timeout: float = loadclient.DEFAULT_TIMEOUT


@dataclass
class Memory:
    """What the operator remembers of one cluster between ticks (lost on restart, by design: the
    rebalancer then waits for a fresh window before it acts)."""

    samples: list[Sample] = field(default_factory=list)
    reconcile_error: tuple[int, str] | None = None  # (generation, message) of the last failed reconcile


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class TickResult:
    status_patch: dict[str, Any]
    events: list[Event] = field(default_factory=list)


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def reconcile(kube: Kube, body: Mapping[str, Any], config: Config, memory: Memory) -> list[Event]:
    """Apply every desired child, then delete the pools' children the spec no longer lists; returns the
    Normal Events of what changed (children created, workloads scaled, stale children deleted).

    Raises :class:`SpecError` or :class:`KubeError`; the error is also kept in ``memory`` so the next tick
    reports it in ``Ready``.
    """
    owner = owner_of(body)
    generation = int(body["metadata"].get("generation") or 0)
    try:
        spec = parse(body.get("spec") or {})
        wanted = children.desired(owner, spec, config.images)
        before = _existing(kube, owner)
        for obj in wanted:
            kube.apply(obj)
        events = change_events(before, wanted)
        events += _delete_stale(kube, owner, wanted)
    except (SpecError, KubeError) as exc:
        memory.reconcile_error = (generation, str(exc))
        raise
    memory.reconcile_error = None
    return events


CHILD_KINDS = ("Service", "NetworkPolicy", "Deployment", "StatefulSet", "PodDisruptionBudget")


def _existing(kube: Kube, owner: Owner) -> dict[tuple[str, str], dict[str, Any]]:
    """The children ``owner`` has now, by (kind, name)."""
    selector = naming.owned_selector(owner)
    return {
        (kind, str((obj.get("metadata") or {}).get("name"))): obj
        for kind in CHILD_KINDS
        for obj in kube.list(kind, owner.namespace, selector)
    }


def change_events(before: Mapping[tuple[str, str], Mapping[str, Any]], wanted: list[dict[str, Any]]) -> list[Event]:
    """A ``Created`` Event per child that did not exist, a ``Scaled`` Event per workload whose replicas moved."""
    events: list[Event] = []
    for obj in wanted:
        kind, name = obj["kind"], obj["metadata"]["name"]
        old = before.get((kind, name))
        if old is None:
            events.append(Event("Normal", c.EVENT_CREATED, f"created {kind} {name}"))
            continue
        if kind in ("Deployment", "StatefulSet"):
            was = (old.get("spec") or {}).get("replicas")
            now = obj["spec"].get("replicas")
            if was is not None and now is not None and was != now:
                events.append(Event("Normal", c.EVENT_SCALED, f"scaled {kind} {name} from {was} to {now} replicas"))
    return events


def _delete_stale(kube: Kube, owner: Owner, wanted: list[dict[str, Any]]) -> list[Event]:
    """Delete target StatefulSets and Services of pools that left the spec, and the budgets of pools that
    left it or hold no replicas (only ones this cluster owns)."""
    keep = {(o["kind"], o["metadata"]["name"]) for o in wanted}
    selector = naming.owned_selector(owner, c.COMPONENT_TARGET)
    events: list[Event] = []
    for kind in ("StatefulSet", "Service", "PodDisruptionBudget"):
        for obj in kube.list(kind, owner.namespace, selector):
            meta = obj.get("metadata") or {}
            owned = any(ref.get("uid") == owner.uid for ref in meta.get("ownerReferences") or [])
            if owned and (kind, meta.get("name")) not in keep:
                # A budget's name is its pool's StatefulSet's: a kept StatefulSet means a pool scaled to 0.
                why = "has no replicas" if ("StatefulSet", meta.get("name")) in keep else "left the spec"
                log.info("deleting %s %s/%s: its pool %s", kind, owner.namespace, meta.get("name"), why)
                kube.delete(kind, owner.namespace, str(meta.get("name")))
                events.append(Event("Normal", c.EVENT_DELETED, f"deleted {kind} {meta.get('name')}: its pool {why}"))
    return events


def observe(kube: Kube, owner: Owner) -> status.Children:
    """The cluster's workloads and pods, by label."""
    return status.Children(
        deployments=kube.list("Deployment", owner.namespace, naming.owned_selector(owner, c.COMPONENT_DRAFT)),
        statefulsets=kube.list("StatefulSet", owner.namespace, naming.owned_selector(owner, c.COMPONENT_TARGET)),
        pods=kube.list("Pod", owner.namespace, naming.owned_selector(owner)),
    )


def policy(spec: ClusterSpec) -> rebalancer.Policy:
    a = spec.autoscaling
    return rebalancer.Policy(
        enabled=a.enabled,
        min_targets=a.min_targets,
        max_targets=a.max_targets,
        underloaded_utilization=a.underloaded_utilization,
        saturated_utilization=a.saturated_utilization,
        stabilization_seconds=float(a.stabilization_window_seconds),
        max_step=a.max_step,
        pool_capacity=pools.capacity(spec.pools),
    )


def tick(
    kube: Kube,
    body: Mapping[str, Any],
    config: Config,
    memory: Memory,
    *,
    now: datetime,
    fetch: Fetch,
) -> TickResult:
    """Observe, maybe rebalance, and compute the status patch. Raises :class:`KubeError` when the children
    cannot be listed (the next tick tries again)."""
    owner = owner_of(body)
    meta = body["metadata"]
    generation = int(meta.get("generation") or 0)
    previous: Mapping[str, Any] = body.get("status") or {}
    try:
        spec: ClusterSpec | None = parse(body.get("spec") or {})
        spec_error = None
    except SpecError as exc:
        spec, spec_error = None, str(exc)
    observed = observe(kube, owner)
    events: list[Event] = []
    if spec is not None:
        observed, events = _repair(kube, body, config, memory, spec, observed, previous.get("observedGeneration"))
    error = memory.reconcile_error
    obs = status.Observation(
        owner=owner,
        generation=generation,
        spec=spec,
        children=observed,
        spec_error=spec_error,
        reconcile_error=error[1] if error and error[0] == generation else None,
    )
    if spec is not None:
        obs, rebalanced = _rebalance(kube, body, memory, spec, obs, now=now, fetch=fetch)
        events += rebalanced
    new = status.build(obs, previous, now)
    return TickResult(status_patch=status.merge_patch(previous, new), events=events)


def _repair(
    kube: Kube,
    body: Mapping[str, Any],
    config: Config,
    memory: Memory,
    spec: ClusterSpec,
    observed: status.Children,
    observed_generation: Any,
) -> tuple[status.Children, list[Event]]:
    """Re-apply when a workload was deleted behind the operator's back (not while a reconcile of this
    generation is pending or has failed: the handler owns those); returns the Events of the repair."""
    owner = owner_of(body)
    generation = body["metadata"].get("generation")
    if observed_generation != generation or memory.reconcile_error is not None:
        return observed, []
    if body["metadata"].get("deletionTimestamp"):  # going away: its children are being collected
        return observed, []
    names = [naming.draft_name(owner)] + [naming.pool_name(owner, p.name) for p in spec.pools]
    present = {(o.get("metadata") or {}).get("name") for o in [*observed.deployments, *observed.statefulsets]}
    if all(n in present for n in names):
        return observed, []
    log.info("children of %s/%s are missing; applying them again", owner.namespace, owner.name)
    try:
        events = reconcile(kube, body, config, memory)
    except (SpecError, KubeError) as exc:
        log.warning("repairing %s/%s failed: %s", owner.namespace, owner.name, exc)
        return observed, []
    return observe(kube, owner), events


def _rebalance(
    kube: Kube,
    body: Mapping[str, Any],
    memory: Memory,
    spec: ClusterSpec,
    obs: status.Observation,
    *,
    now: datetime,
    fetch: Fetch,
) -> tuple[status.Observation, list[Event]]:
    """Read the load, record a sample, decide, and move the count if the decision says so."""
    owner = obs.owner
    annotations = body["metadata"].get("annotations") or {}
    url = loadclient.load_url(owner, annotations)
    deployment = obs.children.named("Deployment", naming.draft_name(owner))
    draft_up = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0) >= 1
    if c.ANNOTATION_LOAD_URL not in annotations and not draft_up:
        return replace(obs, load_error="the draft is not ready"), []
    try:
        load = fetch(url)
    except loadclient.LoadUnavailable as exc:
        return replace(obs, load_error=str(exc)), []
    counts = status.target_counts(owner, spec, obs.children)
    at = now.timestamp()
    memory.samples.append(Sample(at=at, replicas=spec.replicas, ready=counts.ready, load=load))
    pol = policy(spec)
    memory.samples = rebalancer.prune(memory.samples, at, pol.stabilization_seconds)
    last_rebalance = (body.get("status") or {}).get("lastRebalance") or {}
    last = conditions.parse_timestamp(last_rebalance.get("time"))
    decision = rebalancer.decide(
        pol,
        replicas=spec.replicas,
        ready=counts.ready,
        samples=memory.samples,
        now=at,
        last_change=last.timestamp() if last else None,
        climbing=last_rebalance.get("reason") == rebalancer.UNDER_LOADED and last_rebalance.get("to") == spec.replicas,
    )
    events: list[Event] = []
    if decision.changed:
        if kube.swap_replicas(owner.namespace, owner.name, decision.previous, decision.replicas):
            events.append(Event("Normal", c.EVENT_REBALANCED, decision.message))
        else:
            decision = Decision(
                decision.previous,
                decision.previous,
                "Conflict",
                "spec.targets.replicas changed while deciding; deciding again on fresh samples",
            )
    return replace(obs, load=load, decision=decision), events
