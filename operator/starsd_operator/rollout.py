"""Rolling a change of the targets one pool at a time, and halting on a pool whose new pods fail.

A change of the target pods' template (the model, the image, a pod template field) reaches the pools in spec
order through each StatefulSet's ``spec.updateStrategy.rollingUpdate.partition`` (pods at ordinals >= the
partition run the new template, the others keep theirs):

* the first pool with a pending change **rolls** one pod at a time: its partition starts at ``replicas - 1``
  and steps down by one each time the pods above it run the new revision, are ready, and have stayed ready for
  ``minReadySeconds``;
* every later pool with a pending change is **held** at ``partition = replicas``: it takes the new template (a
  pod that is recreated or added comes back at the old revision) but no pod is replaced until every earlier
  pool has **settled** (the StatefulSet's ``currentRevision == updateRevision``, every pod available);
* a rolling pool whose updated pod fails (crash loop, image pull, configuration, or not ready for
  ``progressDeadlineSeconds``) is **halted**: its partition goes back up to ``replicas`` (no further pod, no
  recreated or added pod, gets the failing revision), later pools stay held, and the status says which pod,
  on which revision, and why. A new template (the fix) rolls again from the top; so does the failing pod
  recovering. An updated pod that cannot be scheduled yet is *waiting* (the cluster autoscaler may be adding
  a node): it halts the pool only once the deadline passes.

Whether a pool's change is pending is read from an annotation holding the hash of the template the operator
last applied (so the decision is right in the very request that applies a new template) and from the
StatefulSet's own status (so an operator restarted mid-rollout carries on where it was). :func:`plan` is pure:
the controller passes the StatefulSets and pods it listed and the clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starsd import defaults as d  # the CRD declares the same defaults and ranges (tests/test_defaults.py)

from . import constants as c
from . import diagnose
from .conditions import Condition, parse_timestamp
from .errors import SpecError

ANNOTATION_TEMPLATE_HASH = f"{c.GROUP}/template-hash"
REVISION_LABEL = "controller-revision-hash"  # the StatefulSet controller's label on each pod

# A pool's rollout state (status.targets.pools[].rollout.state).
CREATING = "Creating"  # its StatefulSet does not exist yet: nothing to roll
SETTLED = "Settled"  # every pod runs the pool's latest template
SETTLING = "Settling"  # every pod runs it, some are not available yet, and a later pool waits for them
ROLLING = "Rolling"  # replacing its pods one at a time
HELD = "Held"  # a change is pending, and waits for an earlier pool
HALTED = "Halted"  # an updated pod fails: no further pod is replaced

# The condition's reasons (RolloutProgressing is False only when a rollout is halted, as a Deployment's
# Progressing is False only past its deadline).
REASON_COMPLETE = "RolloutComplete"
REASON_ROLLING = "PoolRolling"
REASON_HALTED = "PoolRolloutHalted"


class RolloutError(SpecError):
    """A ``rollout`` field the operator cannot use; the message names it."""


@dataclass(frozen=True)
class Policy:
    """``spec.target.rollout``."""

    min_ready_seconds: int = d.MIN_READY_SECONDS
    progress_deadline_seconds: int = d.PROGRESS_DEADLINE_SECONDS


def parse(parent: Mapping[str, Any], where: str) -> Policy:
    raw = parent.get("rollout")
    if raw is None:
        return Policy()
    if not isinstance(raw, Mapping):
        raise RolloutError(f"{where}.rollout must be an object")
    at = f"{where}.rollout"
    return Policy(
        min_ready_seconds=_int(raw, "minReadySeconds", at, d.MIN_READY_SECONDS, 0, d.MIN_READY_SECONDS_MAX),
        progress_deadline_seconds=_int(
            raw, "progressDeadlineSeconds", at, d.PROGRESS_DEADLINE_SECONDS, 1, d.PROGRESS_DEADLINE_SECONDS_MAX
        ),
    )


def _int(raw: Mapping[str, Any], key: str, where: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RolloutError(f"{where}.{key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def template_hash(template: Mapping[str, Any]) -> str:
    """A short, stable hash of a pod template (key order does not matter)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PoolView:
    """What :func:`plan` knows of one pool."""

    name: str
    replicas: int  # the pool's desired replicas (its share of spec.targets.replicas)
    template_hash: str  # of the template the operator applies now
    statefulset: Mapping[str, Any] | None  # as listed; None when it does not exist
    pods: Sequence[Mapping[str, Any]] = ()  # the pool's pods
    previous_state: str | None = None  # from the stored status, if any


@dataclass(frozen=True)
class PoolRollout:
    """The decision for one pool."""

    name: str
    state: str
    partition: int
    message: str
    revision: str | None = None  # the StatefulSet's update revision, when known
    updated: int = 0  # pods on that revision


@dataclass(frozen=True)
class Timing:
    """The clock and the bounds :func:`plan` measures pods against."""

    now: float  # seconds since the epoch
    min_ready_seconds: int = d.MIN_READY_SECONDS
    deadline_seconds: int = d.PROGRESS_DEADLINE_SECONDS  # see effective_deadline


def effective_deadline(policy: Policy, startup_seconds: int) -> int:
    """``progressDeadlineSeconds``, never shorter than the startup budget: a pod still loading its model is
    not failing (a pod whose load fails is restarted by the kubelet, which counts as a failure at once)."""
    return max(policy.progress_deadline_seconds, startup_seconds)


@dataclass(frozen=True)
class _Facts:
    exists: bool
    pending: bool | None  # a change to roll; None: the StatefulSet controller has not caught up yet
    partition: int  # the StatefulSet's partition now
    hash_changed: bool = False
    revision: str | None = None  # update revision, when the status describes the template applied now
    available: bool = True
    replicas_now: int = 0
    updated: int = 0


def _facts(pool: PoolView) -> _Facts:
    sts = pool.statefulset
    if sts is None:
        return _Facts(exists=False, pending=False, partition=0)
    meta = sts.get("metadata") or {}
    spec = sts.get("spec") or {}
    status = sts.get("status") or {}
    partition = int(((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition") or 0)
    hash_changed = (meta.get("annotations") or {}).get(ANNOTATION_TEMPLATE_HASH) != pool.template_hash
    observed = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    replicas_now = int(status.get("replicas") or 0)
    available = int(status.get("availableReplicas", status.get("readyReplicas")) or 0) >= replicas_now
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if hash_changed:
        pending: bool | None = True
    elif not observed:
        pending = None
    else:
        pending = current != update
    return _Facts(
        exists=True,
        pending=pending,
        partition=partition,
        hash_changed=hash_changed,
        revision=str(update) if update and observed and not hash_changed else None,
        available=available,
        replicas_now=replicas_now,
        updated=int(status.get("updatedReplicas") or 0),
    )


def plan(pools: Sequence[PoolView], timing: Timing) -> list[PoolRollout]:
    """Each pool's rollout state and partition, in the pools' (spec) order."""
    facts = [_facts(p) for p in pools]
    out: list[PoolRollout] = []
    blocker: PoolRollout | None = None
    for i, (pool, f) in enumerate(zip(pools, facts, strict=True)):
        n = pool.replicas
        if not f.exists:
            out.append(PoolRollout(pool.name, CREATING, 0, f"creating statefulset for pool {pool.name}"))
            continue
        unsettled = f.pending is True or (f.pending is None and pool.previous_state not in (None, SETTLED))
        if blocker is not None and unsettled:
            held = PoolRollout(pool.name, HELD, n, f"held at its current revision until pool {blocker.name} settles")
            out.append(held)
            continue
        if f.pending is None:  # the StatefulSet controller has not seen the last write: change nothing
            state = pool.previous_state or SETTLED
            message = "waiting for the StatefulSet controller to observe the last change"
            out.append(PoolRollout(pool.name, state, f.partition, message))
            if state != SETTLED and blocker is None:
                blocker = out[-1]
            continue
        if f.pending:
            decision = _rolling(pool, f, timing)
            out.append(decision)
            blocker = blocker or decision
            continue
        later_pending = any(g.pending is not False for g in facts[i + 1 :])
        if not f.available and later_pending and blocker is None:
            decision = _settling(pool, f, timing)
            out.append(decision)
            blocker = decision
            continue
        out.append(PoolRollout(pool.name, SETTLED, 0, "every pod runs the pool's latest template", f.revision, n))
    return out


def _rolling(pool: PoolView, f: _Facts, timing: Timing) -> PoolRollout:
    n = pool.replicas
    if f.revision is None:  # a new template: start again from the top
        partition = max(0, n - 1) if f.hash_changed else min(f.partition, max(0, n - 1))
        return PoolRollout(pool.name, ROLLING, partition, f"rolling to a new template, {n} pods, one at a time")
    failing = _failing(pool, f.revision, timing)
    updated = sum(1 for p in _members(pool) if _revision(p) == f.revision)
    if failing is not None:
        message = f"halted at revision {f.revision}: {failing}"
        return PoolRollout(pool.name, HALTED, n, message, f.revision, updated)
    done = _settled_tail(pool, f.revision, timing)
    partition = min(f.partition, max(0, n - 1 - done))
    message = f"rolling to revision {f.revision}: {updated} of {n} pods updated, partition {partition}"
    message += _waiting(pool, f.revision, timing)
    return PoolRollout(pool.name, ROLLING, partition, message, f.revision, updated)


def _settling(pool: PoolView, f: _Facts, timing: Timing) -> PoolRollout:
    n = pool.replicas
    failing = _failing(pool, f.revision, timing) if f.revision else None
    if failing is not None:
        return PoolRollout(pool.name, HALTED, 0, f"halted at revision {f.revision}: {failing}", f.revision, n)
    message = f"every pod runs revision {f.revision}; waiting for all {f.replicas_now} to be available"
    return PoolRollout(pool.name, SETTLING, 0, message, f.revision, f.updated)


def _members(pool: PoolView) -> list[Mapping[str, Any]]:
    """The pool's pods within its replicas, not terminating, highest ordinal first."""
    by_ordinal = [(o, p) for p in pool.pods if (o := _ordinal(p)) is not None and o < pool.replicas]
    live = [(o, p) for o, p in by_ordinal if not (p.get("metadata") or {}).get("deletionTimestamp")]
    return [p for _, p in sorted(live, key=lambda item: -item[0])]


def _settled_tail(pool: PoolView, revision: str, timing: Timing) -> int:
    """How many pods from the top ordinal down run ``revision`` and have been ready ``minReadySeconds``."""
    pods = {_ordinal(p): p for p in _members(pool)}
    count = 0
    for ordinal in range(pool.replicas - 1, -1, -1):
        pod = pods.get(ordinal)
        if pod is None or _revision(pod) != revision or not _available(pod, timing):
            break
        count += 1
    return count


# A pod the scheduler cannot place yet is waiting, not failing: the cluster autoscaler may be adding a node
# (a GPU node takes minutes). It fails only when the deadline passes.
WAITING_REASONS = frozenset({"Unschedulable"})


def _failing(pool: PoolView, revision: str | None, timing: Timing) -> str | None:
    """Why an updated pod fails (its name and its own words), or None."""
    for pod in _members(pool):
        if _revision(pod) != revision:
            continue
        name = (pod.get("metadata") or {}).get("name", "?")
        problems = diagnose.pod_problems(pod)
        failing = [p for p in problems if p.reason not in WAITING_REASONS]
        if failing:
            return f"{failing[0].reason}: {failing[0].message}"
        since = _not_ready_since(pod)
        if since is not None and not _starting(pod) and timing.now - since >= timing.deadline_seconds:
            waited = int(timing.now - since)
            why = f": {problems[0].message}" if problems else ""
            return f"NotReady: pod {name} not ready for {waited}s (deadline {timing.deadline_seconds}s){why}"
    return None


def _waiting(pool: PoolView, revision: str, timing: Timing) -> str:
    """``; pod P waits to be scheduled (Ns of the Ds deadline)`` for an updated pod the scheduler cannot place."""
    for pod in _members(pool):
        if _revision(pod) != revision:
            continue
        if any(p.reason in WAITING_REASONS for p in diagnose.pod_problems(pod)):
            since = _not_ready_since(pod)
            waited = int(timing.now - since) if since is not None else 0
            name = (pod.get("metadata") or {}).get("name", "?")
            return f"; pod {name} waits to be scheduled ({waited}s of the {timing.deadline_seconds}s deadline)"
    return ""


def _ordinal(pod: Mapping[str, Any]) -> int | None:
    name = str((pod.get("metadata") or {}).get("name") or "")
    head, _, tail = name.rpartition("-")
    return int(tail) if head and tail.isdigit() else None


def _revision(pod: Mapping[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(REVISION_LABEL)
    return str(value) if value else None


def _ready_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return dict(cond)
    return None


def _available(pod: Mapping[str, Any], timing: Timing) -> bool:
    """Ready, and for at least ``minReadySeconds``."""
    cond = _ready_condition(pod)
    if cond is None or cond.get("status") != "True":
        return False
    if timing.min_ready_seconds <= 0:
        return True
    since = parse_timestamp(cond.get("lastTransitionTime"))
    return since is not None and timing.now - since.timestamp() >= timing.min_ready_seconds


def _not_ready_since(pod: Mapping[str, Any]) -> float | None:
    """Since when ``pod`` has not been ready (None when it is ready)."""
    cond = _ready_condition(pod)
    if cond is not None and cond.get("status") == "True":
        return None
    when = parse_timestamp((cond or {}).get("lastTransitionTime")) or parse_timestamp(
        (pod.get("metadata") or {}).get("creationTimestamp")
    )
    return when.timestamp() if when is not None else None


def _starting(pod: Mapping[str, Any]) -> bool:
    """Still within its startup probe (a container reports ``started: false``): loading, not failing."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(s.get("started") is False for s in statuses)


def condition(rollouts: Sequence[PoolRollout]) -> Condition:
    """``RolloutProgressing``: False with :data:`REASON_HALTED` while a pool's rollout is halted, True while
    one rolls (:data:`REASON_ROLLING`) or when every pool runs its latest template (:data:`REASON_COMPLETE`)."""
    held = [r.name for r in rollouts if r.state == HELD]
    waiting = f"; held: {', '.join(held)}" if held else ""
    for r in rollouts:
        if r.state == HALTED:
            return Condition(c.COND_ROLLOUT_PROGRESSING, False, REASON_HALTED, f"pool {r.name} {r.message}{waiting}")
    for r in rollouts:
        if r.state in (ROLLING, SETTLING):
            return Condition(c.COND_ROLLOUT_PROGRESSING, True, REASON_ROLLING, f"pool {r.name}: {r.message}{waiting}")
    if held:  # an earlier pool's StatefulSet is about to be created or observed
        return Condition(c.COND_ROLLOUT_PROGRESSING, True, REASON_ROLLING, f"held: {', '.join(held)}")
    return Condition(c.COND_ROLLOUT_PROGRESSING, True, REASON_COMPLETE, "every pool runs its latest template")


@dataclass(frozen=True)
class Transition:
    """An Event worth posting: a pool's rollout changed state."""

    type: str  # Normal | Warning
    reason: str
    message: str


def transitions(previous: Mapping[str, str | None], rollouts: Sequence[PoolRollout]) -> list[Transition]:
    """The Events of the pools whose state changed since ``previous`` (pool name -> state, as stored)."""
    out: list[Transition] = []
    for r in rollouts:
        was = previous.get(r.name)
        if was == r.state:
            continue
        if r.state == HALTED:
            out.append(Transition("Warning", c.EVENT_POOL_ROLLOUT_HALTED, f"pool {r.name} {r.message}"))
        elif r.state == ROLLING:
            head = f"pool {r.name} resumed" if was == HALTED else f"pool {r.name}"
            out.append(Transition("Normal", c.EVENT_POOL_ROLLING, f"{head}: {r.message}"))
        elif r.state == HELD:
            out.append(Transition("Normal", c.EVENT_POOL_ROLLOUT_HELD, f"pool {r.name} {r.message}"))
        elif r.state == SETTLED and was in (ROLLING, HALTED, SETTLING, HELD):
            where = f"revision {r.revision}" if r.revision else "its latest template"
            out.append(Transition("Normal", c.EVENT_POOL_ROLLED_OUT, f"pool {r.name}: every pod runs {where}"))
    return out


def status_entry(r: PoolRollout) -> dict[str, Any]:
    """``status.targets.pools[].rollout``."""
    entry: dict[str, Any] = {"state": r.state, "partition": r.partition, "message": r.message}
    if r.revision:
        entry["revision"] = r.revision
    return entry
