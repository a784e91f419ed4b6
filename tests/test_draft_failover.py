"""The draft client with several drafts, over real gRPC on loopback (emulated drafts in this process): it fails
over when its draft is gone, moves back when its first choice returns with room, loses no round while moving
back, and skips a draft with another vocabulary."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starsd.draft.core import DraftConfig
from starsd.draft.proposers import EmulatedProposer
from starsd.draft.server import DraftServer, DraftServerOptions
from starsd.sampling import SamplingParams
from starsd.verifier.draft_client import DraftClient, DraftClientOptions
from starsd.verifier.draft_link import DraftLink
from starsd.verifier.draft_pool import Reason

VOCAB = 32000
WAIT = 30.0  # seconds a condition may take on a loaded machine before the test fails


async def start_draft(port: int = 0, service_time: float = 0.0, vocab: int = VOCAB) -> DraftServer:
    server = DraftServer(
        EmulatedProposer(service_time, vocab_size=vocab),
        DraftConfig(max_batch=8),
        DraftServerOptions(host="127.0.0.1", port=port, metrics_port=None),
    )
    await server.start()
    return server


def address(server: DraftServer) -> str:
    return f"127.0.0.1:{server.grpc_port}"


def client_for(addresses: list[str]) -> tuple[DraftClient, list[Reason]]:
    options = DraftClientOptions(deadline=10.0, backoff_initial=0.05, backoff_max=0.5, probe_interval=0.2)
    client = DraftClient(addresses, "target-0", "emulated", VOCAB, options)
    switches: list[Reason] = []
    client.on_switch = switches.append
    return client, switches


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT
    while not condition():
        assert loop.time() < end, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)


async def propose(link: DraftLink, committed: list[int]) -> list[int] | None:
    proposal = await link.propose(committed, gamma=3, verify_seconds=0.001)
    return None if proposal is None else proposal.token_ids


def test_fails_over_then_moves_back_without_losing_a_round() -> None:
    async def scenario() -> None:
        first, second = await start_draft(), await start_draft(service_time=0.02)
        first_port = first.grpc_port
        client, switches = client_for([address(first), address(second)])
        client.start()
        try:
            await until(lambda: client.rank == 0, "the client uses its first choice")
            assert client.address == address(first)
            link = DraftLink(client, SamplingParams(), seed=1)
            assert await propose(link, [1, 2, 3]) == [0, 1, 2]
            generation = client.generation

            await first.stop(grace=0)  # the first choice is gone
            await until(lambda: client.rank == 1, "the client moved to the other draft")
            assert client.address == address(second) and client.connected
            assert switches == [Reason.DRAFT_LOST]
            assert client.generation > generation  # sessions start afresh on the new draft
            assert await propose(link, [1, 2, 3, 4]) == [0, 1, 2]
            assert second.core.sessions and not client.incompatible

            # Rounds keep going while the first choice comes back: none may come back without a proposal.
            answers: list[list[int] | None] = []
            first = await start_draft(port=first_port)
            while client.rank != 0:
                answers.append(await propose(link, [1, 2, 3, 4, 5]))
                assert len(answers) < 10_000, "the client never moved back"
            for _ in range(5):
                answers.append(await propose(link, [1, 2, 3, 4, 5]))
            assert switches == [Reason.DRAFT_LOST, Reason.FIRST_CHOICE_BACK]
            assert client.address == address(first)
            assert answers and None not in answers
            await until(lambda: not second.core.streams, "the old stream to the second draft is closed")
        finally:
            await client.stop()
            await first.stop(grace=0)
            await second.stop(grace=0)

    asyncio.run(scenario())


def test_a_draft_with_another_vocabulary_is_skipped() -> None:
    async def scenario() -> None:
        foreign, ours = await start_draft(vocab=1000), await start_draft()
        client, switches = client_for([address(foreign), address(ours)])
        client.start()
        try:
            await until(lambda: client.rank == 1, "the client uses the draft that shares its vocabulary")
            assert client.address == address(ours) and not client.incompatible
            await asyncio.sleep(0.5)  # a few probe intervals: the foreign first choice is never moved back to
            assert client.rank == 1 and switches == []
        finally:
            await client.stop()
            await foreign.stop(grace=0)
            await ours.stop(grace=0)

    asyncio.run(scenario())


def test_with_no_draft_sharing_the_vocabulary_the_client_says_so() -> None:
    async def scenario() -> None:
        a, b = await start_draft(vocab=1000), await start_draft(vocab=2000)
        client, _ = client_for([address(a), address(b)])
        client.start()
        try:
            await until(lambda: client.incompatible, "the client reports the drafts incompatible")
            assert not client.connected and client.rank is None
            assert "vocabulary" in client.last_error
        finally:
            await client.stop()
            await a.stop(grace=0)
            await b.stop(grace=0)

    asyncio.run(scenario())


def test_a_draft_without_room_is_not_moved_back_to() -> None:
    async def scenario() -> None:
        first, second = await start_draft(), await start_draft()
        first_port = first.grpc_port
        client, switches = client_for([address(first), address(second)])
        client.start()
        try:
            await until(lambda: client.rank == 0, "the client uses its first choice")
            await first.stop(grace=0)
            await until(lambda: client.rank == 1, "the client moved to the other draft")
            first = DraftServer(
                EmulatedProposer(0.0, vocab_size=VOCAB),
                DraftConfig(max_sessions=1),
                DraftServerOptions(host="127.0.0.1", port=first_port, metrics_port=None),
            )
            await first.start()
            other, _ = client_for([address(first)])  # another target takes the first draft's only session
            other.start()
            try:
                await until(lambda: other.connected, "the other target is connected")
                assert await propose(DraftLink(other, SamplingParams(), seed=2), [5, 6]) == [0, 1, 2]
                assert len(first.core.sessions) == 1
                await asyncio.sleep(1.0)  # five probe intervals
            finally:
                await other.stop()
            assert client.rank == 1 and switches == [Reason.DRAFT_LOST]
        finally:
            await client.stop()
            await first.stop(grace=0)
            await second.stop(grace=0)

    asyncio.run(scenario())
