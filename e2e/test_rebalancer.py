"""Issue 4's scenario 4: the rebalancer against a real draft server process.

A real `starsd draft` (emulated 4 ms service time) runs on loopback; emulated targets (starsd.bench) keep
sessions going through it with a 100 ms verify time, so the draft is under-loaded and the targets, each
running its one session, report a full batch. The StarSDCluster's `starsd.io/load-url` annotation (honoured
because the e2e operator runs with --allow-load-url-annotation) points the operator at that draft's /v1/load.
The operator must raise spec.targets.replicas toward N* (capped by maxStep and maxTargets), record it once
as an Event and in status.lastRebalance, and then hold while the load holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator

import pytest

from e2e import starsd_cluster as ssd
from e2e.kube import Cluster, wait_until
from e2e.operator_process import OperatorProcess
from starsd.bench import targets as bench_targets
from starsd.bench.draft_process import DraftProcess

SESSIONS = 6  # emulated targets, one session each: the demand
VERIFY_SECONDS = 0.1  # Tp; with Tq = 4 ms, N* = ceil(1 + 0.1/0.004) = 26 and 6 targets keep the draft ~23% busy
START_REPLICAS = 2
MAX_STEP = 4


class EmulatedLoad:
    """Emulated targets driving a draft from a background thread's event loop until stopped."""

    def __init__(self, address: str, sessions: int) -> None:
        self.address = address
        self.sessions = sessions
        self.stop_event: asyncio.Event | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.future: concurrent.futures.Future[list[bench_targets.TargetRun]] | None = None

    async def _run(self) -> list[bench_targets.TargetRun]:
        self.stop_event = asyncio.Event()
        vocab = await bench_targets.fetch_vocab_size(self.address)
        spec = bench_targets.TargetSpec(
            gamma=4, betas=(0.8, 0.8, 0.8, 0.8), verify_seconds=VERIFY_SECONDS, wire_seconds=0.0, vocab_size=vocab
        )
        channels = [bench_targets.open_channel(self.address) for _ in range(self.sessions)]
        try:
            targets = [bench_targets.EmulatedTarget(f"e2e-{i}", ch, spec, seed=i) for i, ch in enumerate(channels)]
            return list(await asyncio.gather(*(t.run(self.stop_event) for t in targets)))
        finally:
            for ch in channels:
                await ch.close()

    def start(self) -> None:
        self.thread.start()
        self.future = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    def stop(self) -> list[bench_targets.TargetRun]:
        assert self.future is not None, "not started"
        if self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        try:
            runs = self.future.result(timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        return list(runs)


@pytest.fixture
def draft(cluster: Cluster) -> Iterator[DraftProcess]:
    process = DraftProcess(["--emulate-service-time", "0.004"])
    try:
        asyncio.run(process.start())
        assert process.proc is not None
        cluster.track("draft", process.proc.pid)
        yield process
    finally:
        process.stop()
        cluster.untrack("draft")


def rebalanced_events(cluster: Cluster, namespace: str) -> list[dict]:
    events = cluster.get("events", namespace=namespace)
    return [e for e in events if e.get("reason") == "Rebalanced" and e["involvedObject"]["name"] == "chat"]


def test_rebalancer_raises_targets_of_an_under_loaded_draft_once_and_holds(
    cluster: Cluster, operator: OperatorProcess, namespace: str, draft: DraftProcess
) -> None:
    load = EmulatedLoad(draft.endpoint.address, SESSIONS)
    load.start()
    try:
        doc = ssd.sample("chat")
        doc["metadata"]["annotations"] = {"starsd.io/load-url": draft.endpoint.load_url}
        doc["spec"]["targets"]["replicas"] = START_REPLICAS
        doc["spec"]["autoscaling"].update(
            enabled=True,
            minTargets=1,
            maxTargets=SESSIONS,
            scaleUp={"stabilizationWindowSeconds": 5, "maxStep": MAX_STEP},
            scaleDown={"stabilizationWindowSeconds": 5, "maxStep": MAX_STEP},
        )
        ssd.apply(cluster, namespace, doc)

        def raised() -> dict | None:
            obj = ssd.get(cluster, namespace, "chat")
            return obj if obj["spec"]["targets"]["replicas"] != START_REPLICAS else None

        obj = wait_until("the rebalancer to change the target count", raised, timeout=150, interval=1)
        # Targets saturated (each emulated target runs its one session), draft under-loaded: up toward N* (26),
        # one capped step (2 + 4), which is also maxTargets.
        expected = min(SESSIONS, START_REPLICAS + MAX_STEP)
        assert obj["spec"]["targets"]["replicas"] == expected
        last = obj["status"]["lastRebalance"]
        assert (last["from"], last["to"], last["reason"]) == (START_REPLICAS, expected, "UnderLoaded")
        assert obj["status"]["recommendedTargets"] >= expected
        ssd.wait_ready(cluster, namespace, "chat", replicas=expected)

        # The load holds: the count must too, for longer than the draft's window plus stabilisation.
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            assert ssd.get(cluster, namespace, "chat")["spec"]["targets"]["replicas"] == expected, "flapped"
            time.sleep(1)
        events = rebalanced_events(cluster, namespace)
        assert len(events) == 1 and events[0].get("count", 1) == 1, events
        assert f"{START_REPLICAS}" in events[0]["message"] and f"{expected}" in events[0]["message"]
    finally:
        runs = load.stop()
    errors = [r.error for r in runs if r.error]
    assert not errors, errors
