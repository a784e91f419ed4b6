"""One writer per cluster: a handler and a tick of the same cluster never run at once, and a pass works on the
newest body known when it starts (clusters.Clusters, what handlers.py runs every pass through)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from starsd_operator import controller
from starsd_operator.clusters import Clusters, newest
from starsd_operator.controller import Config, Memory
from starsd_operator.kube import KubeError
from starsd_operator.loadclient import LoadUnavailable
from starsd_operator.rebalancer import Load

from . import factories as f
from .fakekube import FakeKube

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = Config()
KEY = (f.OWNER.namespace, f.OWNER.name)
H100 = ("StatefulSet", "ml", "chat-target-h100")


class Clock:
    """A fake clock the passes read; each read moves it on by a second."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def no_load(url: str) -> Load:
    raise LoadUnavailable(f"{url}: not served in this test")


def generation(n: int, model: str) -> dict[str, Any]:
    body = f.body(f.spec(target={"model": {"path": model}, "gamma": 4}), generation=n)
    body["metadata"]["resourceVersion"] = str(100 * n)
    return body


class GatedKube(FakeKube):
    """Holds the first apply of ``H100`` made from a worker thread until :attr:`gate` opens, so a test can
    start another pass while one is in the middle of its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.waiting = threading.Event()
        self.armed = False

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if self.armed and (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]) == H100:
            self.armed = False
            self.waiting.set()
            assert self.gate.wait(10), "the gate never opened"
        return super().apply(obj)


def model_of(kube: FakeKube) -> str:
    command = kube.objects[H100]["spec"]["template"]["spec"]["containers"][0]["command"]
    return str(command[command.index("--model") + 1])


def test_a_handler_for_g_plus_1_waits_for_a_tick_on_g_and_wins() -> None:
    clock = Clock()
    kube, clusters = GatedKube(), Clusters()
    g = generation(1, "/models/v1")
    controller.reconcile(kube, g, CONFIG, clusters.memory(KEY), now=clock().timestamp())
    kube.settle()
    g["status"]["observedGeneration"] = 1
    kube.delete(*H100)  # the tick on G will apply G's StatefulSet again (a repair)
    g_plus_1 = generation(2, "/models/v2")
    g_plus_1["status"]["observedGeneration"] = 1
    order: list[str] = []

    def tick(body: Mapping[str, Any], memory: Memory) -> controller.TickResult:
        order.append(f"tick on generation {body['metadata']['generation']}")
        return controller.tick(kube, body, CONFIG, memory, now=clock() + timedelta(seconds=10), fetch=no_load)

    def handler(body: Mapping[str, Any], memory: Memory) -> list[controller.Event]:
        order.append(f"handler on generation {body['metadata']['generation']}")
        return controller.reconcile(kube, body, CONFIG, memory, now=clock().timestamp())

    async def interleave() -> None:
        kube.armed = True
        ticking = asyncio.create_task(clusters.exclusive(KEY, g, tick))
        assert await asyncio.to_thread(kube.waiting.wait, 10)  # the tick is in the middle of its writes
        handling = asyncio.create_task(clusters.exclusive(KEY, g_plus_1, handler))
        await asyncio.sleep(0.2)
        assert order == ["tick on generation 1"]  # the handler waits for the tick
        kube.gate.set()
        await asyncio.gather(ticking, handling)

    asyncio.run(interleave())
    assert order == ["tick on generation 1", "handler on generation 2"]
    assert model_of(kube) == "/models/v2"  # G+1's, not the tick's older G


def test_a_tick_given_an_old_body_works_on_the_newest_one() -> None:
    clusters = Clusters()
    g, g_plus_1 = generation(1, "/models/v1"), generation(2, "/models/v2")
    clusters.seen(g_plus_1)  # the watch delivered G+1 ...
    seen: list[int] = []

    def tick(body: Mapping[str, Any], memory: Memory) -> None:
        seen.append(int(body["metadata"]["generation"]))

    asyncio.run(clusters.exclusive(KEY, g, tick))  # ... while kopf's timer still held G
    assert seen == [2]


def test_passes_of_one_cluster_never_overlap() -> None:
    clusters = Clusters()
    running: dict[str, int] = {}
    overlaps: list[str] = []
    lock = threading.Lock()

    def work(body: Mapping[str, Any], memory: Memory) -> None:
        name = str(body["metadata"]["name"])
        with lock:
            running[name] = running.get(name, 0) + 1
            if running[name] > 1:
                overlaps.append(name)
        threading.Event().wait(0.05)
        with lock:
            running[name] -= 1

    def body(name: str) -> dict[str, Any]:
        out = f.body()
        out["metadata"]["name"] = name
        return out

    async def many() -> None:
        passes = [clusters.exclusive(("ml", n), body(n), work) for n in ("a", "b") for _ in range(5)]
        await asyncio.gather(*passes)

    asyncio.run(many())
    assert overlaps == []


def test_newest_compares_resource_versions_then_generations() -> None:
    old, new = generation(1, "/a"), generation(2, "/b")
    assert newest(old, new) is new and newest(new, old) is new
    del old["metadata"]["resourceVersion"], new["metadata"]["resourceVersion"]
    assert newest(new, old) is new
    assert newest(None, old) is old and newest(old, None) is old


def _poke_and_wait(registry: Clusters, error: Exception) -> None:
    async def main() -> None:
        registry.seen(f.body())
        calls: list[tuple[str, str]] = []

        async def repair(key: tuple[str, str]) -> None:
            calls.append(key)
            raise error

        registry.poke(KEY, repair)
        await asyncio.sleep(0.5)
        assert calls == [KEY]

    asyncio.run(main())


def test_a_repair_refused_by_a_terminating_namespace_is_logged_as_such(caplog: Any) -> None:
    caplog.set_level("INFO", logger="starsd_operator.clusters")
    refusal = KubeError(
        403,
        'statefulsets.apps "chat-draft" is forbidden: unable to create new content in namespace ml '
        "because it is being terminated",
    )
    assert refusal.namespace_terminating
    _poke_and_wait(Clusters(), refusal)
    records = [r for r in caplog.records if r.name == "starsd_operator.clusters"]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in records] == [
        ("INFO", "not repairing ml/chat: its namespace is being deleted", None)
    ]


def test_any_other_failed_repair_is_logged_as_an_error_with_its_traceback(caplog: Any) -> None:
    caplog.set_level("INFO", logger="starsd_operator.clusters")
    forbidden = KubeError(403, 'statefulsets.apps "chat-draft" is forbidden: no RBAC rule allows create')
    assert not forbidden.namespace_terminating
    _poke_and_wait(Clusters(), forbidden)
    records = [r for r in caplog.records if r.name == "starsd_operator.clusters"]
    assert [(r.levelname, r.getMessage()) for r in records] == [("ERROR", "repairing ml/chat failed")]
    assert records[0].exc_info is not None
