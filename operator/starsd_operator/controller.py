"""One reconcile and one periodic tick of a cluster, with the API server and the clock passed in.

:func:`reconcile` makes the children match the spec (create, resume and update all run it). :func:`tick`
observes the children and the draft's load, lets the rebalancer decide, and returns the status patch and the
Events to post; kopf's handlers (:mod:`.handlers`) only adapt these to kopf.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from . import (
    apikey,
    children,
    churn,
    diagnose,
    draft,
    draftcount,
    drift,
    imagepolicy,
    loadclient,
    naming,
    pools,
    rebalancer,
    rollout,
    status,
)
from . import constants as c
from .kube import Kube, KubeError
from .naming import Owner
from .podspec import Images
from .rebalancer import Change, Decision, Load, Sample
from .spec import ClusterSpec, ScalingRules, SpecError, parse

log = logging.getLogger(__name__)

Fetch = Callable[[str], Load]


@dataclass(frozen=True)
class Config:
    """Operator-wide settings."""

    images: Images = field(default_factory=Images)
    load_timeout: float = loadclient.DEFAULT_TIMEOUT
    # Honour the starsd.io/load-url annotation (off by default: anyone who may edit a StarSDCluster could
    # otherwise make the operator GET any URL it can reach).
    allow_load_url_annotation: bool = False


@dataclass
class CountTrack:
    """What the rebalancer remembers of one count it moves (the targets', the drafts')."""

    samples: list[Sample] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # its recent changes (rate limits)
    unready_since: float | None = None  # since when its pods have not all been ready


@dataclass
class Applied:
    """What the operator last applied to one child, and what the API server made of it."""

    resource_version: str | None  # of the object the apply returned
    at: float  # when (seconds)
    desired: str  # hash of the desired object applied
    kept: tuple[str, ...] = ()  # differences an apply did not change (values the API server normalises)


# A child applied this recently and not yet in the watched state (unless the watch saw it deleted since) is not
# missing: the watch has not caught up with the operator's own write. (A child watched at an older version
# is applied again; the apply returns the operator's own last version, and no Event is posted.)
WATCH_GRACE_SECONDS = 3.0


@dataclass
class Memory:
    """What the operator remembers of one cluster between ticks (lost on restart, by design: the
    rebalancer then waits for a fresh window before it acts)."""

    targets: CountTrack = field(default_factory=CountTrack)  # spec.targets.replicas (rebalancer.decide)
    drafts: CountTrack = field(default_factory=CountTrack)  # spec.draft.replicas (rebalancer.decide_drafts)
    reconcile_error: tuple[int, str] | None = None  # (generation, message) of the last failed reconcile
    warned: set[str] = field(default_factory=set)  # Warning reasons already posted (each once per episode)
    last_status_write: float | None = None  # when tick last wrote the status (churn.should_write)
    # The last tick's draft readings and draft decision, for status.drafts (draftcount.status).
    draft_readings: loadclient.DraftReadings | None = None
    draft_decision: Decision | None = None
    applied: dict[tuple[str, str], Applied] = field(default_factory=dict)  # by (kind, name): see repair
    deleted: set[tuple[str, str]] = field(default_factory=set)  # (kind, name) the watch saw deleted


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class TickResult:
    status_patch: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    decision_reason: str | None = None  # the rebalancer's, when it decided (metrics)


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def reconcile(
    kube: Kube, body: Mapping[str, Any], config: Config, memory: Memory, *, now: float | None = None
) -> list[Event]:
    """Apply every desired child, then delete the pools' children the spec no longer lists and a draft
    StatefulSet an older operator made (once the draft Deployment is ready); returns the Normal Events of what
    changed (children created, workloads scaled, stale children deleted). Each pool's StatefulSet gets the
    partition :mod:`.rollout` decides from what runs now (``now``: the clock, seconds).

    Raises :class:`SpecError` or :class:`KubeError`; the error is also kept in ``memory`` so the next tick
    reports it in ``Ready``.
    """
    owner = owner_of(body)
    generation = int(body["metadata"].get("generation") or 0)
    try:
        spec = parse(body.get("spec") or {})
        before = _existing(kube, owner)
        images = cluster_images(owner, spec, body, config, before)
        key = apikey.observe(kube, owner, spec.auth)
        pods = kube.list("Pod", owner.namespace, naming.owned_selector(owner, c.COMPONENT_TARGET))
        sets = [obj for (kind, _), obj in before.items() if kind == "StatefulSet"]
        first = children.desired(owner, spec, images, api_key=key)
        plan = plan_rollouts(owner, spec, body, first, sets, pods, now or time.time())
        wanted = children.desired(owner, spec, images, {r.name: r.partition for r in plan}, key)
        at = time.time() if now is None else now
        for obj in wanted:
            apply(kube, memory, obj, at)
        events = change_events(before, wanted)
        events += _delete_stale(kube, owner, wanted)
        events += _replace_legacy_draft(kube, owner, before)
    except (SpecError, KubeError) as exc:
        memory.reconcile_error = (generation, str(exc))
        raise
    memory.reconcile_error = None
    return events


# StatefulSet: the pools', and the draft StatefulSet of an older operator, to replace it.
CHILD_KINDS = ("Service", "NetworkPolicy", "Deployment", "StatefulSet", "PodDisruptionBudget")


def images_record(kube: Kube, body: Mapping[str, Any], config: Config) -> dict[str, str] | None:
    """``status.images`` after a successful reconcile (None when the spec does not parse)."""
    try:
        spec = parse(body.get("spec") or {})
    except SpecError:
        return None
    owner = owner_of(body)
    return imagepolicy.record(cluster_images(owner, spec, body, config, _existing(kube, owner)))


def cluster_images(
    owner: Owner,
    spec: ClusterSpec,
    body: Mapping[str, Any],
    config: Config,
    existing: Mapping[tuple[str, str], Mapping[str, Any]],
) -> Images:
    """The default images of this cluster's pods under its ``spec.imagePolicy`` (see :mod:`.imagepolicy`)."""
    recorded = (body.get("status") or {}).get("images")
    running: dict[str, str | None] = {}
    if not recorded:
        if spec.draft.image is None:
            drafts = existing.get(("Deployment", naming.draft_name(owner)))
            legacy = existing.get(("StatefulSet", draft.legacy_statefulset(owner)))
            running["draft"] = imagepolicy.container_image(drafts) or imagepolicy.container_image(legacy)
        if spec.target.image is None:
            sets = [existing.get(("StatefulSet", naming.pool_name(owner, p.name))) for p in spec.pools]
            running["target"] = next((i for i in map(imagepolicy.container_image, sets) if i), None)
    return imagepolicy.resolve(spec.image_policy, config.images, recorded, running)


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


def _replace_legacy_draft(kube: Kube, owner: Owner, live: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[Event]:
    """Delete the draft StatefulSet an older operator made, once the draft Deployment (applied first) is ready
    with every draft it asks for: the old drafts serve until the new ones do, so the star has no gap. ``live``
    is what the API server holds (the Deployment's status decides). Idempotent, so an operator restarted
    between the apply and the delete converges on its next pass."""
    name = draft.legacy_statefulset(owner)
    old = live.get(("StatefulSet", name))
    if old is None:
        return []
    refs = (old.get("metadata") or {}).get("ownerReferences") or []
    if not any(ref.get("uid") == owner.uid for ref in refs):
        return []
    deployment = naming.draft_name(owner)
    if not deployment_ready(live.get(("Deployment", deployment))):
        return []
    log.info("deleting StatefulSet %s/%s: the drafts run in Deployment %s now", owner.namespace, name, deployment)
    kube.delete("StatefulSet", owner.namespace, name)
    message = f"deleted StatefulSet {name}: the drafts run in Deployment {deployment} now"
    return [Event("Normal", c.EVENT_DELETED, message)]


def deployment_ready(obj: Mapping[str, Any] | None) -> bool:
    """Whether a Deployment has seen its latest spec and runs every replica it asks for, ready and up to date."""
    if obj is None:
        return False
    meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    want = int(spec.get("replicas", 1) or 0)
    seen = int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    ready = int(st.get("readyReplicas") or 0) >= want and int(st.get("updatedReplicas") or 0) >= want
    return seen and ready and want > 0


def plan_rollouts(
    owner: Owner,
    spec: ClusterSpec,
    body: Mapping[str, Any],
    wanted: Iterable[Mapping[str, Any]],
    statefulsets: Iterable[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: float,
) -> list[rollout.PoolRollout]:
    """Each pool's rollout (see :mod:`.rollout`), from the desired StatefulSets (their template hashes and
    replicas), the ones that exist, the pools' pods and the states the stored status holds."""
    desired = {str(o["metadata"]["name"]): o for o in wanted if o.get("kind") == "StatefulSet"}
    existing = {str((o.get("metadata") or {}).get("name")): o for o in statefulsets}
    observed = status.Children(pods=pods)
    previous = previous_rollouts(body)
    views = []
    for pool in spec.pools:
        name = naming.pool_name(owner, pool.name)
        sts = desired[name]
        views.append(
            rollout.PoolView(
                name=pool.name,
                replicas=int(sts["spec"]["replicas"]),
                template_hash=str(sts["metadata"]["annotations"][rollout.ANNOTATION_TEMPLATE_HASH]),
                statefulset=existing.get(name),
                pods=observed.pods_of(c.COMPONENT_TARGET, pool.name),
                previous_state=previous.get(pool.name),
            )
        )
    policy = spec.target.rollout
    timing = rollout.Timing(
        now=now,
        min_ready_seconds=policy.min_ready_seconds,
        deadline_seconds=rollout.effective_deadline(policy, spec.target.lifecycle.startup_seconds),
    )
    return rollout.plan(views, timing)


def previous_rollouts(body: Mapping[str, Any]) -> dict[str, str | None]:
    """Pool name -> the rollout state the stored status holds."""
    rows = ((body.get("status") or {}).get("targets") or {}).get("pools") or []
    return {str(r.get("name")): (r.get("rollout") or {}).get("state") for r in rows if isinstance(r, Mapping)}


def _step_rollouts(
    body: Mapping[str, Any],
    config: Config,
    spec: ClusterSpec,
    observed: status.Children,
    now: float,
    api_key: apikey.KeyState | None = None,
) -> tuple[list[rollout.PoolRollout] | None, list[Event]]:
    """The pools' rollouts now, and the Events of their changes. A partition that should move (a pod came up
    on the new revision, a pool's turn came, a rollout halted) is applied by :func:`repair`."""
    owner = owner_of(body)
    existing = {("StatefulSet", str((o.get("metadata") or {}).get("name"))): o for o in observed.statefulsets}
    existing.update({("Deployment", str((o.get("metadata") or {}).get("name"))): o for o in observed.deployments})
    try:
        images = cluster_images(owner, spec, body, config, existing)
        wanted = children.desired(owner, spec, images, api_key=api_key)
    except SpecError:
        return None, []
    plan = plan_rollouts(owner, spec, body, wanted, observed.statefulsets, observed.pods, now)
    events = [Event(t.type, t.reason, t.message) for t in rollout.transitions(previous_rollouts(body), plan)]
    return plan, events


def apply(kube: Kube, memory: Memory, obj: Mapping[str, Any], at: float) -> dict[str, Any]:
    """Server-side apply ``obj`` and remember what came back (see :func:`repair`)."""
    result = kube.apply(obj) or {}
    key = (str(obj["kind"]), str(obj["metadata"]["name"]))
    memory.applied[key] = Applied(_version(result), at, _digest(obj))
    return result


def _version(obj: Mapping[str, Any] | None) -> str | None:
    value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


def _digest(obj: Mapping[str, Any]) -> str:
    return rollout.template_hash(obj)


PARTITION = "spec.updateStrategy.rollingUpdate.partition"


def repair(
    kube: Kube,
    body: Mapping[str, Any],
    config: Config,
    memory: Memory,
    spec: ClusterSpec,
    observed: status.Children,
    plan: Sequence[rollout.PoolRollout] | None,
    now: float,
    api_key: apikey.KeyState | None = None,
) -> list[Event]:
    """Compare every child with its desired state and apply again each one that is missing or whose
    operator-owned fields differ (:mod:`.drift`); one ``Repaired`` Event names each and what drifted. A pool's
    rollout partition that ``plan`` moves is applied too, without an Event (it is a rollout step).

    Nothing is applied while a reconcile of this generation is pending or has failed (the handler owns
    those), nor while the cluster is being deleted (its children are being collected)."""
    meta = body["metadata"]
    current = (body.get("status") or {}).get("observedGeneration") == meta.get("generation")
    if not current or memory.reconcile_error is not None or meta.get("deletionTimestamp"):
        return []
    owner = owner_of(body)
    existing = _existing(kube, owner)
    try:
        images = cluster_images(owner, spec, body, config, existing)
        wanted = children.desired(owner, spec, images, {r.name: r.partition for r in plan or ()}, api_key)
    except SpecError:
        return []
    events: list[Event] = []
    for obj in wanted:
        key = (str(obj["kind"]), str(obj["metadata"]["name"]))
        what = f"{key[0]} {key[1]}"
        live, last = existing.get(key), memory.applied.get(key)
        recent = last is not None and 0 <= now - last.at < WATCH_GRACE_SECONDS
        if live is None:
            if not recent or key in memory.deleted:
                memory.deleted.discard(key)
                log.info("%s/%s: %s is missing; applying it again", owner.namespace, owner.name, what)
                apply(kube, memory, obj, now)
                events.append(Event("Normal", c.EVENT_REPAIRED, f"{what} was missing"))
            continue
        digest, version = _digest(obj), _version(live)
        ours = last.resource_version if last is not None else None
        if last is not None and last.desired == digest and version is not None and version == ours:
            continue  # exactly what the operator's own apply left
        diffs = drift.differences(obj, live)
        if not diffs or (last is not None and last.desired == digest and tuple(diffs) == last.kept):
            continue
        result = apply(kube, memory, obj, now)
        if set(diffs) == {PARTITION}:
            log.info("%s/%s: moving the rollout partition of %s", owner.namespace, owner.name, what)
            continue
        if version is not None and _version(result) == version:  # the apply changed nothing: normalised values
            memory.applied[key] = replace(memory.applied[key], kept=tuple(diffs))
            continue
        if ours is not None and _version(result) == ours:  # the watch had not seen the operator's own write yet
            continue
        if last is not None and last.desired != digest:  # the desired state moved (the spec, the key's Secret)
            log.info("%s/%s: %s changed (%s); applied", owner.namespace, owner.name, what, ", ".join(diffs))
            continue
        log.info("%s/%s: %s drifted (%s); applied it again", owner.namespace, owner.name, what, ", ".join(diffs))
        events.append(Event("Normal", c.EVENT_REPAIRED, f"{what} drifted: {', '.join(diffs)}"))
    return events + _replace_legacy_draft(kube, owner, existing)


def converge(kube: Kube, body: Mapping[str, Any], config: Config, memory: Memory, *, now: float) -> list[Event]:
    """The children's half of a tick, run when a watched child changes: :func:`repair` from the watched
    state, without reading the load or writing the status. Returns the Events of the repairs."""
    try:
        spec = parse(body.get("spec") or {})
    except SpecError:
        return []
    owner = owner_of(body)
    observed = observe(kube, owner)
    key = apikey.observe(kube, owner, spec.auth)
    plan, _ = _step_rollouts(body, config, spec, observed, now, key)
    return repair(kube, body, config, memory, spec, observed, plan, now, key)


def observe(kube: Kube, owner: Owner) -> status.Children:
    """The cluster's workloads and pods, by label: the drafts' Deployment and the pools' StatefulSets (and a
    draft StatefulSet left by an older operator)."""
    return status.Children(
        deployments=kube.list("Deployment", owner.namespace, naming.owned_selector(owner, c.COMPONENT_DRAFT)),
        statefulsets=kube.list("StatefulSet", owner.namespace, naming.owned_selector(owner)),
        pods=kube.list("Pod", owner.namespace, naming.owned_selector(owner)),
    )


def _direction(rules: ScalingRules) -> rebalancer.Direction:
    return rebalancer.Direction(
        window_seconds=float(rules.stabilization_window_seconds),
        max_step=rules.max_step,
        policies=tuple(rebalancer.RatePolicy(p.type, p.value, float(p.period_seconds)) for p in rules.policies),
        select=rules.select_policy,
    )


def policy(spec: ClusterSpec) -> rebalancer.Policy:
    a = spec.autoscaling
    return rebalancer.Policy(
        enabled=a.enabled,
        min_targets=a.min_targets,
        max_targets=a.max_targets,
        pool_capacity=pools.capacity(spec.pools),
        underloaded_utilization=a.underloaded_utilization,
        saturated_utilization=a.saturated_utilization,
        scale_in_occupancy=a.scale_in_occupancy,
        saturated_occupancy=a.saturated_occupancy,
        tolerance=a.tolerance,
        scale_in_while_waiting=a.scale_in_while_waiting,
        up=_direction(a.scale_up),
        down=_direction(a.scale_down),
        convergence_timeout_seconds=float(a.convergence_timeout_seconds),
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
    plan: list[rollout.PoolRollout] | None = None
    key: apikey.KeyState | None = None
    if spec is not None:
        key = apikey.observe(kube, owner, spec.auth)  # a changed key rolls the pools (see .apikey)
        plan, events = _step_rollouts(body, config, spec, observed, now.timestamp(), key)
        events += repair(kube, body, config, memory, spec, observed, plan, now.timestamp(), key)
    error = memory.reconcile_error
    obs = status.Observation(
        owner=owner,
        generation=generation,
        spec=spec,
        children=observed,
        spec_error=spec_error,
        reconcile_error=error[1] if error and error[0] == generation else None,
        rollouts=plan,
        api_key=key,
    )
    if spec is not None:
        obs, rebalanced = _rebalance(kube, body, memory, spec, obs, now=now, fetch=fetch, config=config)
        events += rebalanced
    if spec is not None:
        events += gpu_warnings(memory, spec, observed)
    new = status.build(obs, previous, now)
    if spec is not None:
        drafts = draftcount.status(memory.draft_readings, memory.draft_decision, previous, now)["drafts"]
        new["drafts"] = {**(new.get("drafts") or {}), **drafts}
    patch = status.merge_patch(previous, new)
    reason = obs.decision.reason if obs.decision is not None else None
    if not patch or not churn.should_write(previous, new, memory.last_status_write, now.timestamp()):
        return TickResult(status_patch={}, events=events, decision_reason=reason)
    memory.last_status_write = now.timestamp()
    return TickResult(status_patch=patch, events=events, decision_reason=reason)


def external_autoscaler(kube: Kube, owner: Owner) -> str | None:
    """The name of a HorizontalPodAutoscaler whose scaleTargetRef is this cluster, if there is one."""
    for hpa in kube.list("HorizontalPodAutoscaler", owner.namespace, ""):
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        group = str(ref.get("apiVersion") or "").split("/")[0]
        if ref.get("kind") == c.KIND and ref.get("name") == owner.name and group == c.GROUP:
            return str((hpa.get("metadata") or {}).get("name"))
    return None


def _warn_once(memory: Memory, reason: str, message: str, active: bool, key: str | None = None) -> list[Event]:
    """A Warning Event the first time ``active`` holds, none while it keeps holding, re-armed once it clears;
    ``key`` (default: the reason) tells apart causes of one reason (one pool from another)."""
    key = key or reason
    if not active:
        memory.warned.discard(key)
        return []
    if key in memory.warned:
        return []
    memory.warned.add(key)
    return [Event("Warning", reason, message)]


def gpu_warnings(memory: Memory, spec: ClusterSpec, observed: status.Children) -> list[Event]:
    """A ``GPUUnusable`` Warning per role (the drafts, each pool) whose pods stop because they cannot use the
    GPU they ask for (a CPU-only image, no visible GPU: :mod:`.diagnose`), once while it lasts."""
    roles = [("draft", observed.pods_of(c.COMPONENT_DRAFT))]
    roles += [(f"pool {p.name}", observed.pods_of(c.COMPONENT_TARGET, p.name)) for p in spec.pools]
    events: list[Event] = []
    for role, pods in roles:
        problem = diagnose.first_problem(pods)
        unusable = problem is not None and problem.reason == diagnose.GPU_UNUSABLE
        message = problem.message if problem is not None else ""
        message = message if message.startswith(role) else f"{role}: {message}"
        events += _warn_once(memory, diagnose.GPU_UNUSABLE, message, unusable, key=f"{diagnose.GPU_UNUSABLE}/{role}")
    return events


def _rebalance(
    kube: Kube,
    body: Mapping[str, Any],
    memory: Memory,
    spec: ClusterSpec,
    obs: status.Observation,
    *,
    now: datetime,
    fetch: Fetch,
    config: Config,
) -> tuple[status.Observation, list[Event]]:
    """Read the load, record a sample, decide, and move the count if the decision says so."""
    owner = obs.owner
    annotations = body["metadata"].get("annotations") or {}
    events: list[Event] = []
    overridden = config.allow_load_url_annotation and c.ANNOTATION_LOAD_URL in annotations
    events += _warn_once(
        memory,
        c.EVENT_LOAD_URL_IGNORED,
        f"annotation {c.ANNOTATION_LOAD_URL} ignored: the operator reads only the cluster's own draft Service"
        " unless started with --allow-load-url-annotation",
        c.ANNOTATION_LOAD_URL in annotations and not config.allow_load_url_annotation,
    )
    urls = loadclient.load_urls(
        owner, annotations if overridden else None, draftcount.replicas(spec), draftcount.ready_pod_ips(obs.children)
    )
    hpa = external_autoscaler(kube, owner) if spec.autoscaling.enabled else None
    events += _warn_once(
        memory,
        rebalancer.EXTERNAL_AUTOSCALER,
        f"HorizontalPodAutoscaler {hpa} scales this cluster; the rebalancer steps aside while it exists",
        hpa is not None,
    )
    memory.draft_readings, memory.draft_decision = None, None
    ready_drafts = draftcount.ready(obs.children, owner)
    if not overridden and ready_drafts < 1:
        return replace(obs, load_error="the draft is not ready", external_autoscaler=hpa), events
    readings = loadclient.read_all(urls, fetch)
    memory.draft_readings = readings
    load = readings.aggregated()
    if load is None:
        return replace(obs, load_error=readings.error(), external_autoscaler=hpa), events
    obs = replace(obs, load=load, external_autoscaler=hpa)
    if hpa is not None:
        memory.targets.samples.clear()
        memory.drafts.samples.clear()
        return obs, events
    counts = status.target_counts(owner, spec, obs.children)
    at = now.timestamp()
    pol = policy(spec)
    previous = body.get("status") or {}
    drafts_moved, drafted = _rebalance_drafts(kube, owner, memory, spec, pol, load, ready_drafts, previous, at)
    events += drafted
    recorded = status.recorded_change(previous.get("lastRebalance"))
    decision = _decide_count(memory.targets, pol, rebalancer.decide, spec.replicas, counts.ready, load, at, recorded)
    if decision.changed and drafts_moved:
        # One count moves per tick: the drafts first (a saturated draft wants another draft, not more targets).
        decision = Decision(
            decision.previous, decision.previous, rebalancer.STABILIZING, "the draft count moved; deciding again"
        )
    swap = functools.partial(kube.swap_replicas, owner.namespace, owner.name)
    decision, moved = _apply_count(memory.targets, decision, swap, "spec.targets.replicas", at)
    return replace(obs, decision=decision), events + moved


def _rebalance_drafts(
    kube: Kube,
    owner: Owner,
    memory: Memory,
    spec: ClusterSpec,
    pol: rebalancer.Policy,
    load: Load,
    ready: int,
    previous: Mapping[str, Any],
    at: float,
) -> tuple[bool, list[Event]]:
    """Decide the draft count and patch ``spec.draft.replicas`` when it moves; (moved, Events)."""
    lo, hi = draftcount.bounds(spec)
    replicas = draftcount.replicas(spec)
    if not pol.enabled or (lo == hi == replicas):
        return False, []
    dpol = rebalancer.draft_policy(pol, lo, hi)
    recorded = draftcount.last_change(previous)
    decision = _decide_count(memory.drafts, dpol, rebalancer.decide_drafts, replicas, ready, load, at, recorded)
    swap = functools.partial(kube.swap_draft_replicas, owner.namespace, owner.name)
    decision, events = _apply_count(memory.drafts, decision, swap, "spec.draft.replicas", at)
    memory.draft_decision = decision
    return decision.changed, events


def _decide_count(
    track: CountTrack,
    pol: rebalancer.Policy,
    decide: Callable[..., Decision],
    replicas: int,
    ready: int,
    load: Load,
    at: float,
    recorded: list[Change],
) -> Decision:
    """Record this tick's sample of one count and decide it (``decide``: rebalancer.decide or decide_drafts).
    ``recorded`` is the last change the status holds: the rate limits' memory after an operator restart."""
    achievable = min(max(replicas, pol.pool_capacity[0]), pol.pool_capacity[1])
    if ready >= achievable:
        track.unready_since = None
    elif track.unready_since is None:
        track.unready_since = at
    track.samples.append(Sample(at=at, replicas=replicas, ready=ready, load=load))
    track.samples = rebalancer.prune(track.samples, at, pol.history_seconds)
    track.changes = rebalancer.prune_changes(track.changes or recorded, at, pol.history_seconds)
    decision: Decision = decide(
        pol,
        replicas=replicas,
        ready=ready,
        samples=track.samples,
        now=at,
        changes=track.changes,
        unready_since=track.unready_since,
    )
    return decision


def _apply_count(
    track: CountTrack, decision: Decision, swap: Callable[[int, int], bool], path: str, at: float
) -> tuple[Decision, list[Event]]:
    """Move a count as ``decision`` says with ``swap(expected, new)`` (an atomic test-and-replace of ``path``);
    when the spec changed meanwhile nothing moves, and the next tick decides on fresh samples."""
    if not decision.changed:
        return decision, []
    if not swap(decision.previous, decision.replicas):
        message = f"{path} changed while deciding; deciding again on fresh samples"
        return Decision(decision.previous, decision.previous, "Conflict", message), []
    track.changes.append(Change(at, decision.previous, decision.replicas))
    track.unready_since = None
    return decision, [Event("Normal", c.EVENT_REBALANCED, decision.message)]
