"""Why a child is not ready, read from what the kubelet, the scheduler and the controllers report.

The schema cannot see that a model path is missing on the node or that no node carries a pool's labels;
those show up here as pods that crash with a termination message or stay Pending unschedulable, and become
``Ready=False`` with the reason and the pod's own words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from starsd.devices import CUDA_REFUSAL  # torch-free: the words a process told --device cuda stops with

from . import constants as c

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
TERMINATION_MESSAGE_LIMIT = 300
# A GPU pod whose process cannot use a GPU (a CPU-only image, no visible GPU): the condition's and the Warning
# Event's reason; the message names the pool, the node and the image variant.
GPU_UNUSABLE = "GPUUnusable"


@dataclass(frozen=True)
class Problem:
    """Something that keeps a pod from serving. ``reason`` is CamelCase, for a condition; ``pool`` is the
    target pool of the pod it was found on (None for a draft, or a workload)."""

    reason: str
    message: str
    pool: str | None = None


@dataclass(frozen=True)
class Pending:
    """Pods the scheduler has not placed (``PodScheduled=False``): how many, and the scheduler's reason and
    message for the first of them by name (e.g. ``Unschedulable``, ``0/5 nodes are available: ...``)."""

    pods: int
    reason: str
    message: str


@dataclass(frozen=True)
class Rollout:
    """A Deployment's or StatefulSet's progress towards ``desired`` ready, up-to-date replicas."""

    exists: bool
    desired: int = 0
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    observed: bool = False  # the controller has seen the latest spec

    @property
    def complete(self) -> bool:
        return (
            self.exists
            and self.observed
            and self.replicas == self.desired
            and self.updated >= self.desired
            and self.ready >= self.desired
        )


def rollout(workload: Mapping[str, Any] | None, desired: int | None = None) -> Rollout:
    """The rollout of a Deployment or StatefulSet; ``desired`` defaults to its ``spec.replicas``."""
    if workload is None:
        return Rollout(exists=False, desired=desired or 0)
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    want = int(spec.get("replicas", 1)) if desired is None else desired
    return Rollout(
        exists=True,
        desired=want,
        replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        observed=int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
        and int(spec.get("replicas", 1)) == want,
    )


def deployment_problems(deployment: Mapping[str, Any] | None) -> list[Problem]:
    """A Deployment that gave up progressing (``ProgressDeadlineExceeded``)."""
    if deployment is None:
        return []
    name = (deployment.get("metadata") or {}).get("name", "?")
    problems = []
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            problems.append(Problem("ProgressDeadlineExceeded", f"deployment {name}: {cond.get('message', '')}"))
    return problems


def pod_problems(pod: Mapping[str, Any]) -> list[Problem]:
    """What keeps ``pod`` from running: scheduling, image, configuration, crashes, failure."""
    meta = pod.get("metadata") or {}
    name = meta.get("name", "?")
    pool = (meta.get("labels") or {}).get(c.LABEL_POOL)
    status = pod.get("status") or {}
    problems: list[Problem] = []
    if status.get("phase") == "Failed":
        problems.append(Problem("PodFailed", _join(f"pod {name} failed", status.get("reason"), status.get("message"))))
    unplaced = _unscheduled(pod)
    if unplaced is not None:
        problems.append(Problem(unplaced[0], _join(f"pod {name} cannot be scheduled", unplaced[1])))
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for container in statuses:
        problem = _container_problem(name, container, pool)
        if problem is not None:
            problems.append(problem)
    return [replace(p, pool=pool) for p in problems]


def pending(pods: Sequence[Mapping[str, Any]]) -> Pending | None:
    """The pods among ``pods`` that the scheduler could not place, or None when it placed them all."""
    unplaced = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        found = _unscheduled(pod)
        if found is not None:
            unplaced.append(found)
    if not unplaced:
        return None
    reason, message = unplaced[0]
    return Pending(pods=len(unplaced), reason=reason, message=message)


def _unscheduled(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The scheduler's reason and message for a pod it has not placed (its ``PodScheduled=False`` condition)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or "").strip()
    return None


def first_problem(
    pods: Sequence[Mapping[str, Any]], workloads: Sequence[Mapping[str, Any] | None] = ()
) -> Problem | None:
    """The most telling problem among ``pods`` and ``workloads``: a crash or a scheduling failure says more
    than a progress deadline, so pods come first, then by pod name for a stable message."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        problems = pod_problems(pod)
        if problems:
            return problems[0]
    for workload in workloads:
        problems = deployment_problems(workload)
        if problems:
            return problems[0]
    return None


def _container_problem(pod: str, container: Mapping[str, Any], pool: str | None = None) -> Problem | None:
    cname = container.get("name", "?")
    where = f"pod {pod} container {cname}"
    state = container.get("state") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    waiting = state.get("waiting") or {}
    terminated = state.get("terminated") or {}
    reason = waiting.get("reason")
    if reason in IMAGE_PULL_REASONS:
        return Problem("ImagePullFailed", _join(f"{where}: {reason}", waiting.get("message")))
    if reason in CONFIG_REASONS:
        return Problem("ContainerConfigError", _join(f"{where}: {reason}", waiting.get("message")))
    if terminated and terminated.get("exitCode", 0) != 0:
        return _failing(where, terminated, container, pool)
    failed_before = last and last.get("exitCode", 0) != 0 and int(container.get("restartCount") or 0) > 0
    if reason == "CrashLoopBackOff" or (failed_before and not container.get("ready")):
        return _failing(where, last or terminated, container, pool)
    return None


def _failing(where: str, terminated: Mapping[str, Any], container: Mapping[str, Any], pool: str | None) -> Problem:
    """A container that exits; one that refused the GPU it was told to use is named, with its pool."""
    if CUDA_REFUSAL in str(terminated.get("message") or ""):
        head = f"pool {pool}: {where}" if pool else where
        return Problem(GPU_UNUSABLE, _exited(head, terminated, container, whole=True))
    return Problem("ContainerFailing", _exited(where, terminated, container))


def _exited(where: str, terminated: Mapping[str, Any], container: Mapping[str, Any], *, whole: bool = False) -> str:
    """``where`` exited: the process's own last words (its termination message) come first; ``whole``
    keeps all of them (a message of the process's own, short, and naming the node at its start)."""
    detail = f"exit code {terminated.get('exitCode', '?')}, {int(container.get('restartCount') or 0)} restarts"
    said = str(terminated.get("message") or "").strip()
    said = said if whole else _tail(said)
    reason = terminated.get("reason")
    head = f"{where} exited ({detail}{', ' + reason if reason and reason != 'Error' else ''})"
    return f"{head}: {said}" if said else head


def _tail(text: str) -> str:
    """The end of a long termination message (a log tail ends with the error)."""
    if len(text) <= TERMINATION_MESSAGE_LIMIT:
        return text
    return "..." + text[-TERMINATION_MESSAGE_LIMIT:]


def _join(head: str, *details: Any) -> str:
    parts = [str(d).strip() for d in details if d and str(d).strip()]
    return ": ".join([head, *parts]) if parts else head
