"""Finding the drafts live (``--drafts-from dns:HOST:PORT``): the flag, the lookups, and a target that keeps
serving whatever the resolver does (no such name, an empty answer, no answer): it keeps its current draft or
decodes alone, and says so in its log and /readyz. Real gRPC drafts on loopback; the resolver is the test's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from starsd import cli
from starsd.devices import resolve
from starsd.draft.core import DraftConfig
from starsd.draft.proposers import EmulatedProposer
from starsd.draft.server import DraftServer, DraftServerOptions
from starsd.openai_api.app import TargetApp, TargetServerOptions
from starsd.verifier.discovery import DnsSource, DraftDiscovery, DraftSourceError, parse_drafts_from
from starsd.verifier.draft_client import DraftClient, DraftClientOptions
from starsd.verifier.metrics import TargetMetrics
from starsd.verifier.scheduler import KvBudget
from tests.support.fakedns import FakeDns

VOCAB = 32000
WAIT = 30.0
SOURCE = DnsSource("chat-draft-pods.ml.svc", 0)  # the port is each test's draft's


# --- the flag -----------------------------------------------------------------------------------------------


def test_drafts_from_names_a_dns_host_and_port() -> None:
    assert parse_drafts_from("dns:chat-draft-pods.ml.svc:50051") == DnsSource("chat-draft-pods.ml.svc", 50051)
    assert str(parse_drafts_from("dns:///d.ns.svc:7")) == "dns:d.ns.svc:7"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("chat-draft-pods:50051", "write dns:HOST:PORT"),
        ("dns:chat-draft-pods", "has no port"),
        ("dns::50051", "has no port"),
        ("dns:a.svc:http", "has port 'http'"),
        ("dns:a.svc:70000", "has port '70000'"),
        ("dns:a,b:50051", "is not one DNS name"),
    ],
)
def test_a_malformed_drafts_from_is_refused_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(DraftSourceError, match="--drafts-from") as err:
        parse_drafts_from(text)
    assert says in str(err.value)


def test_the_target_refuses_both_a_list_and_drafts_from_before_loading_its_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["target", "--model", "/nonexistent", "--draft", "a:1", "--drafts-from", "dns:d.svc:50051"]
    assert cli.main(argv) == 2
    assert "either as a --draft list or with --drafts-from" in capsys.readouterr().err


def test_the_target_help_describes_drafts_from(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["target", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--drafts-from dns:HOST:PORT" in out and "rendezvous hashing" in out


# --- lookups ------------------------------------------------------------------------------------------------


def test_a_failed_lookup_keeps_the_drafts_last_found_and_says_why() -> None:
    async def scenario() -> None:
        dns = FakeDns(["10.0.0.1", "10.0.0.2"])
        found = DraftDiscovery(DnsSource("d.svc", 50051), "t-0", dns, timeout=0.2)
        assert await found.refresh() and set(found.order) == {"10.0.0.1:50051", "10.0.0.2:50051"}
        order = found.order
        dns.nxdomain()
        assert not await found.refresh()
        assert found.order == order and "does not resolve" in found.error
        dns.heal([])
        assert not await found.refresh()
        assert found.order == order and "lists no draft" in found.error
        dns.heal(["10.0.0.2"])
        assert await found.refresh() and found.order == ("10.0.0.2:50051",) and found.error == ""

    asyncio.run(scenario())


def test_a_resolver_that_hangs_times_out_and_only_one_lookup_waits_on_it() -> None:
    async def scenario() -> None:
        dns = FakeDns(["10.0.0.1"])
        found = DraftDiscovery(DnsSource("d.svc", 50051), "t-0", dns, timeout=0.05)
        dns.hang = True
        assert not await found.refresh()
        assert "did not answer" in found.error and found.order == ()
        assert not await found.refresh()  # the first lookup still hangs: no second thread is started
        assert "has not returned yet" in found.error and dns.lookups == 1
        dns.heal(["10.0.0.1"])
        await asyncio.sleep(0)  # let the released lookup finish
        for _ in range(100):
            if await found.refresh():
                break
            await asyncio.sleep(0.01)
        assert found.order == ("10.0.0.1:50051",) and found.error == ""

    asyncio.run(scenario())


def test_any_exception_from_a_resolver_is_a_failed_lookup() -> None:
    def broken(host: str, port: int) -> list[str]:
        raise RuntimeError("resolver bug")

    async def scenario() -> None:
        found = DraftDiscovery(DnsSource("d.svc", 1), "t-0", broken)
        assert not await found.refresh()
        assert found.error == "RuntimeError: resolver bug"

    asyncio.run(scenario())


# --- a target whose lookups fail ------------------------------------------------------------------------------


class DraftOnlyEngine:
    """The target app's view of an engine: its draft client is real, the rest stands in (no model)."""

    def __init__(self, draft: DraftClient) -> None:
        self.loaded = SimpleNamespace(
            vocab_size=VOCAB, max_context=64, tokenizer=None, eos_token_id=None, name="m", placement=resolve("cpu")
        )
        self.budget = KvBudget(max_num_seqs=4, kv_tokens=1024)
        self.draft = draft
        self.metrics = TargetMetrics()


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT
    while not condition():
        assert loop.time() < end, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


async def readyz(http: TestClient[Any, Any]) -> dict[str, Any]:
    resp = await http.get("/readyz")
    assert resp.status == 200
    body: dict[str, Any] = await resp.json()
    return body


def test_a_target_keeps_its_draft_while_lookups_fail_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        draft = DraftServer(
            EmulatedProposer(0.0, vocab_size=VOCAB),
            DraftConfig(),
            DraftServerOptions(host="127.0.0.1", port=0, metrics_port=None),
        )
        await draft.start()
        dns = FakeDns(["127.0.0.1"])
        found = DraftDiscovery(DnsSource("d.svc", draft.grpc_port), "t-0", dns, interval=0.05, timeout=0.1)
        await found.refresh()
        client = DraftClient((), "t-0", "emulated", VOCAB, DraftClientOptions(), discovery=found)
        http: TestClient[Any, Any] = TestClient(
            TestServer(
                TargetApp(DraftOnlyEngine(client), TargetServerOptions(target_id="t-0", served_model="m")).build()
            )  # type: ignore[arg-type]
        )
        await http.start_server()
        client.start()
        try:
            await until(lambda: client.connected, "the target reaches its draft")
            for fault, says in [(dns.nxdomain, "does not resolve"), (lambda: dns.heal([]), "lists no draft")]:
                fault()
                await until(lambda: bool(found.error), "a lookup fails")
                body = await readyz(http)
                assert says in body["drafts_error"], body
                assert body["draft_connected"] and body["draft_address"] == f"127.0.0.1:{draft.grpc_port}"
                assert body["drafts_from"] == f"dns:d.svc:{draft.grpc_port}"
                dns.heal(["127.0.0.1"])
                await until(lambda: not found.error, "lookups work again")
            dns.hang = True
            await until(lambda: "did not answer" in found.error or "not returned" in found.error, "a lookup hangs")
            assert (await readyz(http))["draft_connected"]
            dns.heal(["127.0.0.1"])
            await until(lambda: not found.error, "lookups work again")
            assert client.connected
            metrics = await (await http.get("/metrics")).text()
            assert "starsd_target_drafts_found 1.0" in metrics
        finally:
            await client.stop()
            await http.close()
            await draft.stop(grace=0)
        logged = [r.getMessage() for r in caplog.records if r.name == "starsd.verifier.discovery"]
        assert any("does not resolve" in m and "keeping the 1 drafts last found" in m for m in logged), logged
        assert any("lists no draft" in m for m in logged)

    with caplog.at_level(logging.INFO, logger="starsd.verifier.discovery"):
        asyncio.run(scenario())


def test_a_target_that_finds_no_draft_decodes_alone_and_connects_once_one_is_found(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        draft = DraftServer(
            EmulatedProposer(0.0, vocab_size=VOCAB),
            DraftConfig(),
            DraftServerOptions(host="127.0.0.1", port=0, metrics_port=None),
        )
        await draft.start()
        dns = FakeDns()
        dns.nxdomain()
        found = DraftDiscovery(DnsSource("d.svc", draft.grpc_port), "t-0", dns, interval=0.05, timeout=0.1)
        await found.refresh()
        client = DraftClient((), "t-0", "emulated", VOCAB, DraftClientOptions(backoff_max=0.2), discovery=found)
        http: TestClient[Any, Any] = TestClient(
            TestServer(
                TargetApp(DraftOnlyEngine(client), TargetServerOptions(target_id="t-0", served_model="m")).build()
            )  # type: ignore[arg-type]
        )
        await http.start_server()
        client.start()
        try:
            await asyncio.sleep(0.3)  # several lookups and connection attempts: nothing breaks
            body = await readyz(http)
            assert body["status"] == "ready" and not body["draft_connected"] and body["drafts"] == []
            assert "does not resolve" in body["drafts_error"] and "no draft found" in body["draft_error"]
            dns.heal(["127.0.0.1"])
            await until(lambda: client.connected, "the target reaches the draft found")
            assert (await readyz(http))["draft_rank"] == 0
        finally:
            await client.stop()
            await http.close()
            await draft.stop(grace=0)
        logged = [r.getMessage() for r in caplog.records if r.name == "starsd.verifier.discovery"]
        assert any("does not resolve" in m and "decoding alone" in m for m in logged), logged

    with caplog.at_level(logging.INFO, logger="starsd.verifier.discovery"):
        asyncio.run(scenario())
