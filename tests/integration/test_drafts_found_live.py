"""Drafts found live, real servers on loopback: real draft gRPC servers (real tiny models), real targets (their
engines and HTTP apps in this process), and a resolver the test controls. Two drafts, then a third, then one of
the first two no longer listed: every target moves exactly as rendezvous hashing says, no request fails, and
every output is the target's own greedy output.

Each draft listens on its own loopback address (127.0.0.1, .2, .3) on one port, as pods behind a headless
Service each have their own IP and the same port."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from starsd.checkpoints import load_checkpoint
from starsd.draft.core import DraftConfig
from starsd.draft.proposers import ModelProposer
from starsd.draft.server import DraftServer, DraftServerOptions
from starsd.local import free_port
from starsd.openai_api.app import TargetApp, TargetServerOptions
from starsd.verifier.discovery import DnsSource, DraftDiscovery, assign_slots, order_for
from starsd.verifier.draft_client import DraftClient, DraftClientOptions
from starsd.verifier.engine import TargetEngine
from tests.support.fakedns import FakeDns
from tests.support.reference import autoregressive_reference

TARGETS = 8
IPS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
PROMPTS = [[5, 17, 42, 7, 99], [3, 3, 8, 120], [64, 1, 2, 9, 77, 31], [11, 250, 6]]
MAX_TOKENS = 12
WAIT = 120.0  # settling on a loaded machine
log = logging.getLogger(__name__)


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT
    while not condition():
        assert loop.time() < end, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


def expected(target_ids: list[str], slots: dict[str, int]) -> dict[str, str]:
    return {t: order_for(t, slots)[0] for t in target_ids}


def test_targets_follow_the_drafts_found_as_rendezvous_hashing_says(random_pair: tuple[Path, Path]) -> None:
    draft_path, target_path = random_pair
    target_model = load_checkpoint(target_path)
    greedy = {tuple(p): autoregressive_reference(target_model, p, MAX_TOKENS) for p in PROMPTS}
    port = free_port()

    async def scenario() -> dict[str, Any]:
        drafts: dict[str, DraftServer] = {}

        async def start_draft(ip: str) -> None:
            server = DraftServer(
                ModelProposer(load_checkpoint(draft_path)),
                DraftConfig(max_batch=8),
                DraftServerOptions(host=ip, port=port, metrics_port=None),
            )
            await server.start()
            drafts[f"{ip}:{port}"] = server

        dns = FakeDns(IPS[:2])
        for ip in IPS[:2]:
            await start_draft(ip)
        ids = [f"chat-target-h100-{i}" for i in range(TARGETS)]
        clients: dict[str, DraftClient] = {}
        engines: list[TargetEngine] = []
        http: dict[str, TestClient[Any, Any]] = {}
        options = DraftClientOptions(deadline=30.0, backoff_initial=0.05, backoff_max=0.5, probe_interval=0.2)
        for tid in ids:
            found = DraftDiscovery(DnsSource("chat-draft-pods.ml.svc", port), tid, dns, interval=0.1, timeout=1.0)
            await found.refresh()
            loaded = load_checkpoint(target_path)
            client = DraftClient((), tid, loaded.fingerprint, loaded.vocab_size, options, discovery=found)
            engine = TargetEngine(loaded, client)
            app = TargetApp(engine, TargetServerOptions(target_id=tid, served_model="t"))
            http[tid] = TestClient(TestServer(app.build()))
            await http[tid].start_server()
            client.start()
            clients[tid], engines = client, [*engines, engine]

        results: dict[str, Any] = {"failed": [], "wrong": [], "done": 0, "moves": {}}
        stop = asyncio.Event()

        async def workload(tid: str) -> None:
            n = 0
            while not stop.is_set():
                prompt = PROMPTS[n % len(PROMPTS)]
                n += 1
                body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
                resp = await http[tid].post("/v1/completions", json=body)
                if resp.status != 200:
                    results["failed"].append((tid, resp.status, await resp.text()))
                    continue
                got = (await resp.json())["starsd"]["token_ids"]
                results["done"] += 1
                if got != greedy[tuple(prompt)]:
                    results["wrong"].append((tid, prompt, got))

        def using() -> dict[str, str]:
            return {t: c.address if c.connected else "" for t, c in clients.items()}

        try:
            slots = assign_slots({}, (f"{ip}:{port}" for ip in IPS[:2]))
            want = expected(ids, slots)
            await until(lambda: using() == want, "every target uses its rendezvous choice of two drafts")
            assert set(want.values()) == set(drafts), "with 8 targets both drafts are somebody's choice"
            tasks = [asyncio.create_task(workload(t)) for t in ids]
            await until(lambda: results["done"] >= TARGETS, "the workload runs")

            # A third draft becomes ready: it is listed, and wins the targets rendezvous hashing gives it.
            await start_draft(IPS[2])
            before = using()
            listed = time.monotonic()
            dns.answer = list(IPS)
            new = f"{IPS[2]}:{port}"
            await until(lambda: bool(drafts[new].core.streams), "a target connects to the new draft")
            results["first_connect_seconds"] = time.monotonic() - listed
            slots = assign_slots(slots, (f"{ip}:{port}" for ip in IPS))
            want = expected(ids, slots)
            await until(lambda: using() == want, "every target uses its rendezvous choice of three drafts")
            moved = {t for t in ids if before[t] != want[t]}
            assert moved == {t for t in ids if want[t] == new}, "only the targets the new draft wins move"
            results["moves"]["2->3"] = (len(moved), TARGETS / 3)
            mark = results["done"]
            await until(lambda: results["done"] >= mark + TARGETS, "the workload runs on three drafts")

            # The first draft is no longer listed (its pod is leaving): only its targets move, to their next.
            gone = f"{IPS[0]}:{port}"
            before = using()
            dns.answer = IPS[1:]
            slots = assign_slots(slots, (f"{ip}:{port}" for ip in IPS[1:]))
            want = expected(ids, slots)
            await until(lambda: using() == want, "every target uses its rendezvous choice of the two left")
            moved = {t for t in ids if before[t] != want[t]}
            assert moved == {t for t in ids if before[t] == gone}, "only the removed draft's targets move"
            results["moves"]["3->2"] = (len(moved), TARGETS / 3)
            mark = results["done"]
            await until(lambda: results["done"] >= mark + TARGETS, "the workload runs on two drafts")
            stop.set()
            await asyncio.gather(*tasks)
            results["readyz"] = {t: await (await http[t].get("/readyz")).json() for t in ids}
            results["want"] = want
        finally:
            stop.set()
            for client in clients.values():
                await client.stop()
            for h in http.values():
                await h.close()
            for server in drafts.values():
                await server.stop(grace=0)
            for engine in engines:
                engine.close()
        return results

    results = asyncio.run(scenario())
    assert results["failed"] == [], results["failed"][:3]
    assert results["wrong"] == [], results["wrong"][:3]
    for tid, body in results["readyz"].items():
        assert body["draft_address"] == results["want"][tid] and body["draft_rank"] == 0
        assert body["drafts_from"].startswith("dns:chat-draft-pods.ml.svc:") and body["drafts_error"] == ""
    # The figures the documentation quotes (pytest -s shows them).
    print(f"\ntargets moved (measured, expected about N/D): {results['moves']}")
    print(f"a new draft listed -> its first target connected: {results['first_connect_seconds']:.3f} s")
    print(f"completions served: {results['done']}, failed: {len(results['failed'])}")


@pytest.fixture(autouse=True)
def _quiet_grpc_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
