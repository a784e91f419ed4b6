"""The rebalancer's traces, run through the operator's real tick with a fake clock.

tests/operator/test_rebalancer.py drives :func:`rebalancer.decide` through a small model of the operator's
loop (``Run``) to check the control law over many traces. Here the same traces go through
:func:`starsd_operator.controller.tick` itself (an in-memory API server, the clock advanced by the test, each
change of the count applied and its StatefulSets made ready at once), and the count must move exactly as the
model says: the model's results are then results about the operator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starsd_operator import constants as c
from starsd_operator import controller
from starsd_operator.controller import Config, Memory
from starsd_operator.rebalancer import Load
from starsd_operator.spec import parse

from . import factories as f
from .fakekube import FakeKube
from .test_rebalancer import INTERVAL, Run, balanced, idle_targets, saturated_draft, saturated_targets

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LOAD_URL = "http://127.0.0.1:7777/v1/load"
CONFIG = Config(allow_load_url_annotation=True)
AUTOSCALING = {
    "enabled": True,
    "minTargets": 1,
    "maxTargets": 16,
    "scaleUp": {"stabilizationWindowSeconds": 30, "maxStep": 4},
    "scaleDown": {"stabilizationWindowSeconds": 60, "maxStep": 2},
}
Trace = Callable[[int, int], Load]


def cluster(replicas: int) -> dict[str, Any]:
    spec = f.spec(autoscaling=AUTOSCALING, targets={"replicas": replicas})
    return f.body(spec, annotations={c.ANNOTATION_LOAD_URL: LOAD_URL})


def applied(kube: FakeKube, body: dict[str, Any], memory: Memory) -> None:
    """What the operator's handler does with a new spec: reconcile it; the pods then become ready."""
    controller.reconcile(kube, body, CONFIG, memory)
    kube.settle()
    body["status"]["observedGeneration"] = body["metadata"]["generation"]


def real_history(trace: Trace, replicas: int, ticks: int) -> list[int]:
    """The target count after each of ``ticks`` real ticks, ``INTERVAL`` seconds of a fake clock apart."""
    body = cluster(replicas)
    kube, memory = FakeKube(), Memory()
    applied(kube, body, memory)
    history = []
    for i in range(ticks):
        now = T0 + timedelta(seconds=INTERVAL * (i + 1))
        current = body["spec"]["targets"]["replicas"]
        result = controller.tick(kube, body, CONFIG, memory, now=now, fetch=lambda _url, i=i, n=current: trace(i, n))
        body["status"].update(result.status_patch)
        if kube.swaps and kube.swaps[-1][1] != current:  # the swap lands in the spec: a new generation
            body["spec"]["targets"]["replicas"] = kube.swaps[-1][1]
            body["metadata"]["generation"] += 1
            applied(kube, body, memory)
        history.append(body["spec"]["targets"]["replicas"])
    return history


def model_history(trace: Trace, replicas: int, ticks: int, up_window: float | None = None) -> list[int]:
    policy = controller.policy(parse(cluster(replicas)["spec"]))
    if up_window is not None:
        policy = replace(policy, up=replace(policy.up, window_seconds=up_window))
    run = Run(policy, replicas, trace, interval=INTERVAL, now=T0.timestamp())
    return run.go(ticks).history


def alternating(a: Load, b: Load, period: int) -> Trace:
    return lambda tick, _n: a if (tick // period) % 2 == 0 else b


TRACES: dict[str, tuple[Trace, int]] = {
    "saturated targets scale up toward N*": (lambda _t, _n: saturated_targets(7), 2),
    "idle targets scale down to the minimum": (lambda _t, _n: idle_targets(), 9),
    "a saturated draft scales down toward N*": (lambda _t, _n: saturated_draft(3), 8),
    "balanced holds": (lambda _t, _n: balanced(), 5),
    "a signal faster than the window holds": (alternating(saturated_targets(9), idle_targets(), 2), 5),
    "a slow signal moves both ways": (alternating(saturated_targets(12), idle_targets(), 30), 4),
}


@pytest.mark.parametrize("name", list(TRACES))
def test_the_real_tick_moves_the_count_as_the_model_of_the_loop_does(name: str) -> None:
    trace, replicas = TRACES[name]
    ticks = 90
    real = real_history(trace, replicas, ticks)
    assert real == model_history(trace, replicas, ticks)
    if name != "balanced holds" and "faster" not in name:
        assert len(set(real)) > 1, "the trace never moved the count: it tests nothing"


def test_the_comparison_sees_a_model_that_waits_another_window() -> None:
    """The check can fail: the model with a 10 s scale-up window where the operator has 30 s parts from it."""
    trace, replicas = TRACES["saturated targets scale up toward N*"]
    assert real_history(trace, replicas, 30) != model_history(trace, replicas, 30, up_window=10.0)
