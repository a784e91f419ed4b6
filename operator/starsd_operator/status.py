"""A cluster's ``status``, aggregated from its children and the draft's load.

:func:`build` returns the status the operator owns as a plain dict; :func:`merge_patch` turns the change
from the stored status into the smallest JSON merge patch, so an unchanged cluster is not written at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import apikey, diagnose, naming, pools, rollout
from . import constants as c
from .conditions import Condition, parse_timestamp, render, timestamp
from .naming import Owner
from .rebalancer import CONVERGENCE_TIMEOUT, EXTERNAL_AUTOSCALER, NOT_CONVERGED, Change, Decision, Load
from .spec import ClusterSpec


@dataclass(frozen=True)
class Children:
    """What the API server holds for one cluster (plain dicts, as listed)."""

    deployments: Sequence[Mapping[str, Any]] = ()
    statefulsets: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()

    def named(self, kind: str, name: str) -> Mapping[str, Any] | None:
        items = self.deployments if kind == "Deployment" else self.statefulsets
        return next((o for o in items if (o.get("metadata") or {}).get("name") == name), None)

    def pods_of(self, component: str, pool: str | None = None) -> list[Mapping[str, Any]]:
        def matches(pod: Mapping[str, Any]) -> bool:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            return labels.get(c.LABEL_COMPONENT) == component and (pool is None or labels.get(c.LABEL_POOL) == pool)

        return [p for p in self.pods if matches(p)]


@dataclass(frozen=True)
class Observation:
    """Everything one status computation looks at."""

    owner: Owner
    generation: int
    spec: ClusterSpec | None  # None when the spec could not be parsed
    children: Children = field(default_factory=Children)
    spec_error: str | None = None
    reconcile_error: str | None = None
    load: Load | None = None
    load_error: str | None = None
    decision: Decision | None = None
    external_autoscaler: str | None = None  # the HPA that scales this cluster, if any
    rollouts: Sequence[rollout.PoolRollout] | None = None  # each pool's rollout (None: not decided)
    api_key: apikey.KeyState | None = None  # the API key's Secret (None: not read)


@dataclass(frozen=True)
class TargetCounts:
    replicas: int
    ready: int
    desired: int


def target_counts(owner: Owner, spec: ClusterSpec, children: Children) -> TargetCounts:
    """Existing, ready and desired targets summed over the pools' StatefulSets."""
    split = pools.split(spec.replicas, spec.pools)
    replicas = ready = 0
    for pool in spec.pools:
        sts = children.named("StatefulSet", naming.pool_name(owner, pool.name))
        status = (sts or {}).get("status") or {}
        replicas += int(status.get("replicas") or 0)
        ready += int(status.get("readyReplicas") or 0)
    return TargetCounts(replicas=replicas, ready=ready, desired=sum(split.values()))


def build(obs: Observation, previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The full status the operator owns, from ``obs``; ``previous`` is the stored status."""
    owner = obs.owner
    out: dict[str, Any] = {
        "observedGeneration": previous.get("observedGeneration"),
        "selector": naming.status_selector(owner),
        "lastRebalance": previous.get("lastRebalance"),
        "images": previous.get("images"),  # written by the reconcile (imagepolicy.py)
    }
    draft_cond = Condition(c.COND_DRAFT_READY, False, "InvalidSpec", obs.spec_error or "")
    targets_cond = Condition(c.COND_TARGETS_READY, False, "InvalidSpec", obs.spec_error or "")
    star_cond = Condition(c.COND_STAR_CONNECTED, False, "InvalidSpec", obs.spec_error or "")
    rollout_cond = Condition(c.COND_ROLLOUT_PROGRESSING, False, "InvalidSpec", obs.spec_error or "", unknown=True)
    auth_cond = Condition(c.COND_AUTH_READY, False, "InvalidSpec", obs.spec_error or "")
    if obs.spec is not None:
        auth_cond = apikey.condition(obs.api_key, owner.namespace)
    if obs.rollouts is not None:
        rollout_cond = rollout.condition(obs.rollouts)
    elif obs.spec is not None:
        why = obs.reconcile_error or "the pools' templates cannot be built"
        rollout_cond = Condition(c.COND_ROLLOUT_PROGRESSING, False, "Unknown", why, unknown=True)
    if obs.spec is not None:
        draft_cond, out["draft"] = _draft(obs)
        out["drafts"] = _drafts(obs.owner, obs.spec, obs.children)
        targets_cond, out["targets"] = _targets(owner, obs.spec, obs.children, obs.rollouts)
        star_cond = _star(obs, out["targets"]["readyReplicas"])
        if obs.load is not None:
            out["targets"]["connected"] = obs.load.targets
    if obs.load is not None:
        out["recommendedTargets"] = obs.load.optimal_targets()
    if obs.decision is not None and obs.decision.changed:
        out["lastRebalance"] = rebalance_record(obs.decision, now)
    wanted = [
        _ready(obs, previous, draft_cond, targets_cond, star_cond, auth_cond),
        draft_cond,
        targets_cond,
        star_cond,
        _rebalancing(obs, out.get("lastRebalance")),
        rollout_cond,
        auth_cond,
    ]
    generation = obs.generation if obs.spec is not None else None
    out["conditions"] = render(wanted, previous.get("conditions"), generation=generation, now=now)
    return {k: v for k, v in out.items() if v is not None}


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns ``old`` into ``new`` (``None`` deletes; lists are replaced)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    return patch


def _drafts(owner: Owner, spec: ClusterSpec, children: Children) -> dict[str, Any]:
    """``status.drafts``: the draft Deployment's pods, existing and ready, against ``spec.draft.replicas``."""
    sts_status = (children.named("Deployment", naming.draft_name(owner)) or {}).get("status") or {}
    ready = int(sts_status.get("readyReplicas") or 0)
    desired = spec.draft.replicas
    return {
        "replicas": int(sts_status.get("replicas") or 0),
        "ready": ready,
        "desired": desired,
        "readyOfDesired": f"{ready}/{desired}",  # the DRAFTS column, as TARGETS
    }


def _draft(obs: Observation) -> tuple[Condition, dict[str, Any]]:
    """``DraftReady``: every one of the ``spec.draft.replicas`` draft pods ready and up to date."""
    owner = obs.owner
    name = naming.draft_name(owner)
    drafts = obs.children.named("Deployment", name)
    want = obs.spec.draft.replicas if obs.spec is not None else 1
    progress = diagnose.rollout(drafts, desired=want)
    problem = diagnose.first_problem(obs.children.pods_of(c.COMPONENT_DRAFT))
    if not progress.exists:
        cond = Condition(c.COND_DRAFT_READY, False, "NotCreated", f"deployment {name} does not exist yet")
    elif progress.complete:
        ready = f"draft {name} is ready" if want == 1 else f"{want} drafts of {name} are ready"
        cond = Condition(c.COND_DRAFT_READY, True, "Available", ready)
    elif problem is not None:
        cond = Condition(c.COND_DRAFT_READY, False, problem.reason, problem.message)
    else:
        cond = Condition(
            c.COND_DRAFT_READY,
            False,
            "Progressing",
            f"draft {name}: {progress.ready} of {want} ready, {progress.updated} up to date",
        )
    draft: dict[str, Any] = {"ready": cond.ok, "endpoint": naming.draft_endpoint(owner)}
    if obs.load is not None:
        draft.update(
            utilization=round(obs.load.utilization, 2),
            regime=obs.load.regime or None,
            queueDepth=round(obs.load.queue_depth, 2),
            activeSessions=obs.load.active_sessions,
            connectedTargets=obs.load.targets,
            runningRequests=obs.load.running_requests,
            waitingRequests=obs.load.waiting_requests,
            targetOccupancy=round(obs.load.target_occupancy, 2),
        )
    return cond, {k: v for k, v in draft.items() if v is not None}


def _targets(
    owner: Owner, spec: ClusterSpec, children: Children, rollouts: Sequence[rollout.PoolRollout] | None = None
) -> tuple[Condition, dict[str, Any]]:
    split = pools.split(spec.replicas, spec.pools)
    rolls = {r.name: r for r in rollouts or ()}
    waiting: dict[str, diagnose.Pending] = {}
    pool_status: list[dict[str, Any]] = []
    missing: list[str] = []
    complete = True
    for pool in spec.pools:
        sts_name = naming.pool_name(owner, pool.name)
        sts = children.named("StatefulSet", sts_name)
        progress = diagnose.rollout(sts, desired=split[pool.name])
        if not progress.exists:
            missing.append(sts_name)
        complete = complete and progress.complete
        row: dict[str, Any] = {
            "name": pool.name,
            "replicas": progress.replicas,
            "readyReplicas": progress.ready,
            "updatedReplicas": progress.updated,
            "desiredReplicas": split[pool.name],
        }
        if pool.name in rolls:
            row["rollout"] = rollout.status_entry(rolls[pool.name])
        unplaced = diagnose.pending(children.pods_of(c.COMPONENT_TARGET, pool.name))
        if unplaced is not None:
            waiting[pool.name] = unplaced
            row["pending"] = {"pods": unplaced.pods, "reason": unplaced.reason, "message": unplaced.message}
        pool_status.append(row)
    counts = target_counts(owner, spec, children)
    summary: dict[str, Any] = {
        "replicas": counts.replicas,
        "readyReplicas": counts.ready,
        "desiredReplicas": counts.desired,
        "readyOfDesired": f"{counts.ready}/{counts.desired}",  # the TARGETS column, as a Deployment's READY
        "pools": pool_status,
    }
    capped = "" if counts.desired == spec.replicas else f" (pool bounds cap {spec.replicas} at {counts.desired})"
    problem = diagnose.first_problem(children.pods_of(c.COMPONENT_TARGET))
    if missing:
        cond = Condition(
            c.COND_TARGETS_READY, False, "NotCreated", f"statefulsets {', '.join(missing)} do not exist yet"
        )
    elif complete:
        cond = Condition(
            c.COND_TARGETS_READY, True, "AllReplicasReady", f"{counts.ready} of {counts.desired} targets ready{capped}"
        )
    elif problem is not None:
        cond = Condition(c.COND_TARGETS_READY, False, problem.reason, _in_pool(problem, waiting))
    else:
        cond = Condition(
            c.COND_TARGETS_READY,
            False,
            "Progressing",
            f"{counts.ready} of {counts.desired} targets ready{capped}",
        )
    return cond, summary


def _in_pool(problem: diagnose.Problem, waiting: Mapping[str, diagnose.Pending]) -> str:
    """A target problem's message with its pool named first, and, when the scheduler cannot place the pool's
    pods, how many wait: ``pool h100: 2 pods Pending: pod chat-target-h100-0 cannot be scheduled: ...``."""
    if problem.pool is None:
        return problem.message
    head = f"pool {problem.pool}"
    unplaced = waiting.get(problem.pool)
    if unplaced is not None and unplaced.reason == problem.reason:
        head += f": {unplaced.pods} pod{'s' if unplaced.pods != 1 else ''} Pending"
    return problem.message if problem.message.startswith(f"pool {problem.pool}:") else f"{head}: {problem.message}"


def _star(obs: Observation, ready: int) -> Condition:
    """Whether the ready targets are connected to the draft, by the draft's own count of target streams."""
    if obs.load is None:
        why = obs.load_error or "no load reading yet"
        message = f"the draft's load cannot be read: {why}"
        return Condition(c.COND_STAR_CONNECTED, False, "LoadUnavailable", message, unknown=True)
    connected = obs.load.targets
    if connected >= ready:
        return Condition(
            c.COND_STAR_CONNECTED, True, "Connected", f"{connected} targets connected to the draft, {ready} ready"
        )
    return Condition(
        c.COND_STAR_CONNECTED,
        False,
        "TargetsNotConnected",
        f"{connected} of {ready} ready targets connected to the draft; {ready - connected} not connected",
    )


def _ready(
    obs: Observation,
    previous: Mapping[str, Any],
    draft: Condition,
    targets: Condition,
    star: Condition,
    auth: Condition | None = None,
) -> Condition:
    if obs.spec_error is not None:
        return Condition(c.COND_READY, False, "InvalidSpec", obs.spec_error)
    if obs.reconcile_error is not None:
        return Condition(c.COND_READY, False, "ReconcileFailed", obs.reconcile_error)
    if previous.get("observedGeneration") != obs.generation:
        return Condition(c.COND_READY, False, "Reconciling", f"applying generation {obs.generation}")
    if auth is not None and not auth.ok and not auth.unknown:  # the target pods cannot start
        return Condition(c.COND_READY, False, auth.reason, f"auth: {auth.message}")
    if not draft.ok:
        return Condition(c.COND_READY, False, draft.reason, f"draft: {draft.message}")
    if not targets.ok:
        return Condition(c.COND_READY, False, targets.reason, f"targets: {targets.message}")
    if not star.ok and not star.unknown:
        return Condition(c.COND_READY, False, star.reason, f"star: {star.message}")
    return Condition(c.COND_READY, True, "Ready", f"draft ready; {targets.message}")


def _rebalancing(obs: Observation, last: Mapping[str, Any] | None) -> Condition:
    decision = obs.decision
    if obs.spec is None or not obs.spec.autoscaling.enabled:
        return Condition(c.COND_REBALANCING, False, "Disabled", "autoscaling is disabled")
    if obs.external_autoscaler is not None:
        return Condition(
            c.COND_REBALANCING,
            False,
            EXTERNAL_AUTOSCALER,
            f"HorizontalPodAutoscaler {obs.external_autoscaler} scales this cluster; the rebalancer steps aside",
        )
    if decision is not None and decision.timed_out:
        problem = diagnose.first_problem(obs.children.pods_of(c.COMPONENT_TARGET))
        blocking = f"; blocking: {problem.reason}: {problem.message}" if problem else ""
        return Condition(c.COND_REBALANCING, decision.changed, CONVERGENCE_TIMEOUT, decision.message + blocking)
    if decision is not None and decision.changed:
        return Condition(c.COND_REBALANCING, True, decision.reason, decision.message)
    if decision is not None and decision.reason == NOT_CONVERGED and last and last.get("to") == obs.spec.replicas:
        return Condition(c.COND_REBALANCING, True, "Converging", decision.message)
    if obs.load_error is not None:
        return Condition(c.COND_REBALANCING, False, "LoadUnavailable", obs.load_error)
    if decision is None:
        return Condition(c.COND_REBALANCING, False, "Waiting", "no decision yet")
    return Condition(c.COND_REBALANCING, False, decision.reason, decision.message)


def rebalance_record(decision: Decision, now: datetime) -> dict[str, Any]:
    """A change of a count as the status records it: ``status.lastRebalance`` (targets) and
    ``status.drafts.lastRebalance`` (drafts)."""
    return {
        "time": timestamp(now),
        "from": decision.previous,
        "to": decision.replicas,
        "reason": decision.reason,
        "message": decision.message,
    }


def recorded_change(record: Mapping[str, Any] | None) -> list[Change]:
    """The change a :func:`rebalance_record` holds (the rate limits' memory after a restart); [] for none or a
    malformed one."""
    record = record or {}
    when = parse_timestamp(record.get("time"))
    if when is None or not isinstance(record.get("from"), int) or not isinstance(record.get("to"), int):
        return []
    return [Change(when.timestamp(), record["from"], record["to"])]
