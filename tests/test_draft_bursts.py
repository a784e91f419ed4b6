"""A target's burst in one message each way (``ProposeBursts``): the client groups the requests a step queued
together, the draft drafts them as one batch and answers them as Propose would (same sessions, same tokens, same
errors), over real gRPC on loopback with the shipped draft checkpoint; clients use it only where the draft's
Info offers it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from starsd.checkpoints import load_checkpoint
from starsd.draft.core import DraftConfig
from starsd.draft.proposers import ModelProposer
from starsd.draft.server import DraftServer, DraftServerOptions
from starsd.draft.servicer import DraftServicer, burst_requests, ready_answers
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from starsd.verifier.draft_client import DraftClient, DraftClientOptions
from starsd.verifier.draft_stream import answers, bursts

WAIT = 60.0  # seconds a call may take on a loaded machine before the test fails


def request(session: int, seq: int = 1, tokens: list[int] | None = None, gamma: int = 3) -> pb.ProposeRequest:
    return pb.ProposeRequest(
        target_id="t", session_id=session, seq=seq, tokens=tokens if tokens is not None else [5, 6, 7], gamma=gamma
    )


async def collect(it: AsyncIterator[pb.ProposeBurst]) -> list[list[int]]:
    return [[int(r.session_id) for r in burst.requests] async for burst in it]


# --- the client's grouping and the server's ungrouping (pure, on a queue) -------------------------------------


def test_the_requests_queued_together_travel_as_one_burst() -> None:
    async def scenario() -> list[list[int]]:
        queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()
        for s in (1, 2, 3):
            queue.put_nowait(request(s))
        grouped = bursts(queue)
        first = await grouped.__anext__()
        queue.put_nowait(request(4))  # queued after the first burst left: the next message
        queue.put_nowait(None)
        return [[int(r.session_id) for r in first.requests], *await collect(grouped)]

    assert asyncio.run(scenario()) == [[1, 2, 3], [4]]


def test_a_burst_over_the_byte_limit_goes_as_several_messages_in_order() -> None:
    async def scenario() -> list[list[int]]:
        queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()
        for s in range(1, 6):
            queue.put_nowait(request(s, tokens=list(range(100))))
        queue.put_nowait(None)
        one = request(1, tokens=list(range(100))).ByteSize()
        return await collect(bursts(queue, limit=2 * one))

    assert asyncio.run(scenario()) == [[1, 2], [3, 4], [5]]


def test_the_requests_before_the_half_close_are_sent_and_nothing_after() -> None:
    async def scenario() -> list[list[int]]:
        queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()
        for item in (request(1), request(2), None, request(3)):
            queue.put_nowait(item)
        return await collect(bursts(queue))

    assert asyncio.run(scenario()) == [[1, 2]]


def test_the_draft_reads_a_burst_as_requests_each_knowing_how_many_follow() -> None:
    async def scenario() -> list[tuple[int, int]]:
        async def two_bursts() -> AsyncIterator[pb.ProposeBurst]:
            yield pb.ProposeBurst(requests=[request(1), request(2), request(3)])
            yield pb.ProposeBurst(requests=[request(4)])

        return [(int(r.session_id), int(r.following)) async for r in burst_requests(two_bursts())]

    assert asyncio.run(scenario()) == [(1, 2), (2, 1), (3, 0), (4, 0)]


def test_the_answers_ready_together_go_in_one_reply_and_the_end_is_seen() -> None:
    async def scenario() -> tuple[list[int], bool, list[int], bool, list[int]]:
        outgoing: asyncio.Queue[pb.ProposeResponse | None] = asyncio.Queue()
        for seq in (2, 3):
            outgoing.put_nowait(pb.ProposeResponse(seq=seq))
        reply, ended = ready_answers(outgoing, pb.ProposeResponse(seq=1))
        outgoing.put_nowait(pb.ProposeResponse(seq=5))
        outgoing.put_nowait(None)
        outgoing.put_nowait(pb.ProposeResponse(seq=6))  # never sent: the stream ended before it
        last, last_ended = ready_answers(outgoing, pb.ProposeResponse(seq=4))
        flat = [int(r.seq) async for r in answers(_replies(reply, last))]
        return [int(r.seq) for r in reply.responses], ended, [int(r.seq) for r in last.responses], last_ended, flat

    first, ended, last, last_ended, flat = asyncio.run(scenario())
    assert (first, ended) == ([1, 2, 3], False)
    assert (last, last_ended) == ([4, 5], True)
    assert flat == [1, 2, 3, 4, 5]


async def _replies(*replies: pb.ProposeBurstReply) -> AsyncIterator[pb.ProposeBurstReply]:
    for reply in replies:
        yield reply


# --- a real draft server on the shipped checkpoint ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_proposer(shipped_pair: tuple[Path, Path]) -> Iterator[ModelProposer]:
    proposer = ModelProposer(load_checkpoint(shipped_pair[0]), cuda_graphs="off", ahead="off")
    yield proposer


async def start_draft(proposer: ModelProposer) -> DraftServer:
    # A batch may wait as long as a test may take for the rest of its burst (the default 3 ms is a bound for
    # serving; a loaded test machine can take longer to read the burst's requests off the stream).
    config = DraftConfig(max_batch=8, gather_seconds=WAIT)
    server = DraftServer(proposer, config, DraftServerOptions(host="127.0.0.1", port=0, metrics_port=None))
    await server.start()
    return server


def batches(server: DraftServer) -> float:
    value = server.core.metrics.registry.get_sample_value("starsd_draft_batch_size_count")
    return float(value or 0.0)


async def one_by_one(stub: pb_grpc.DraftStub, steps: list[list[pb.ProposeRequest]]) -> list[pb.ProposeResponse]:
    """Each request on one Propose call, waiting for its answer before the next (a reference run); the call's
    sessions are freed when it ends."""
    queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()

    async def feed() -> AsyncIterator[pb.ProposeRequest]:
        while (req := await queue.get()) is not None:
            yield req

    call = stub.Propose(feed())
    out = []
    for req in (r for step in steps for r in step):
        queue.put_nowait(req)
        out.append(await asyncio.wait_for(call.read(), WAIT))
    queue.put_nowait(None)
    assert await asyncio.wait_for(call.read(), WAIT) is grpc.aio.EOF  # the call ended: its sessions are gone
    return out


def sessions_of(prompts: list[list[int]], step: int) -> list[pb.ProposeRequest]:
    """Step ``step`` (0: the prompts) of one session per prompt, each accepting one proposed token per step."""
    return [
        request(i + 1, seq=step + 1, tokens=prompt if step == 0 else [prompt[0] + step], gamma=4)
        for i, prompt in enumerate(prompts)
    ]


def test_a_burst_is_drafted_as_one_batch_with_the_answers_propose_gives(model_proposer: ModelProposer) -> None:
    prompts = [[3, 17, 99, 4], [250, 12], [7, 7, 7, 7, 7, 7], [1000, 3, 44]]

    async def scenario() -> tuple[list[list[int]], list[list[int]], float, int]:
        server = await start_draft(model_proposer)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                stub = pb_grpc.DraftStub(channel)
                info = await stub.Info(pb.InfoRequest(), timeout=WAIT)
                assert info.bursts, "the draft must offer ProposeBursts in its Info"
                answered_alone = await one_by_one(stub, [sessions_of(prompts, step) for step in range(3)])
                reference = [list(r.token_ids) for r in answered_alone]
                call = stub.ProposeBursts()
                before = batches(server)
                got: list[list[int]] = []
                replies = 0
                for step in range(3):
                    await call.write(pb.ProposeBurst(requests=sessions_of(prompts, step)))
                    answered: list[pb.ProposeResponse] = []
                    while len(answered) < len(prompts):
                        reply = await asyncio.wait_for(call.read(), WAIT)
                        replies += 1
                        answered += reply.responses
                    got += [list(r.token_ids) for r in sorted(answered, key=lambda r: r.session_id)]
                await call.done_writing()
                return reference, got, batches(server) - before, replies
        finally:
            await server.stop()

    reference, got, batch_count, replies = asyncio.run(scenario())
    assert all(len(tokens) == 4 for tokens in reference), reference
    assert got == reference  # the same sessions, the same greedy tokens
    assert batch_count == 3  # one batch per burst
    assert replies == 3  # a batch's answers leave together


def test_a_bad_request_in_a_burst_is_answered_with_its_error_and_the_rest_are_drafted(
    model_proposer: ModelProposer,
) -> None:
    async def scenario() -> dict[int, pb.ProposeResponse]:
        server = await start_draft(model_proposer)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                call = pb_grpc.DraftStub(channel).ProposeBursts()
                burst = [request(1), request(2, gamma=0), request(3, seq=2), request(4)]
                await call.write(pb.ProposeBurst(requests=burst))
                out: dict[int, pb.ProposeResponse] = {}
                while len(out) < len(burst):
                    reply = await asyncio.wait_for(call.read(), WAIT)
                    out.update({int(r.session_id): r for r in reply.responses})
                await call.done_writing()
                return out
        finally:
            await server.stop()

    out = asyncio.run(scenario())
    assert out[2].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "gamma" in out[2].error_message
    assert out[3].error_code == grpc.StatusCode.NOT_FOUND.value[0]
    for good in (1, 4):
        assert out[good].error_code == 0 and len(out[good].token_ids) == 3


def test_a_burst_without_a_target_id_ends_the_call_as_propose_does(model_proposer: ModelProposer) -> None:
    async def scenario() -> grpc.StatusCode:
        server = await start_draft(model_proposer)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                call = pb_grpc.DraftStub(channel).ProposeBursts()
                anonymous = pb.ProposeRequest(session_id=1, seq=1, tokens=[3], gamma=2)
                await call.write(pb.ProposeBurst(requests=[anonymous]))
                await call.done_writing()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in call:
                        pass
                return err.value.code()
        finally:
            await server.stop()

    assert asyncio.run(scenario()) == grpc.StatusCode.INVALID_ARGUMENT


def test_the_client_sends_bursts_to_a_draft_that_offers_them(
    model_proposer: ModelProposer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def spied(name: str) -> object:
        original = getattr(DraftServicer, name)

        async def spy(self: DraftServicer, it: AsyncIterator[object], context: object) -> AsyncIterator[object]:
            calls.append(name)
            async for message in original(self, it, context):
                yield message

        return spy

    for name in ("Propose", "ProposeBursts"):
        monkeypatch.setattr(DraftServicer, name, spied(name))
    fingerprint = model_proposer.info.vocab_fingerprint

    async def scenario() -> list[list[int]]:
        server = await start_draft(model_proposer)
        client = DraftClient(
            f"127.0.0.1:{server.grpc_port}", "t", fingerprint, model_proposer.info.vocab_size, DraftClientOptions()
        )
        client.start()
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + WAIT
            while not client.connected:
                assert loop.time() < end, "the client did not connect"
                await asyncio.sleep(0.02)
            futures = [client.send(r) for r in sessions_of([[3, 17], [250, 12, 9]], 0)]
            answered = await asyncio.wait_for(asyncio.gather(*[f for f in futures if f is not None]), WAIT)
            return [list(a.token_ids) for a in answered if a is not None]
        finally:
            await client.stop()
            await server.stop()

    got = asyncio.run(scenario())
    assert [len(t) for t in got] == [4, 4]
    assert calls == ["ProposeBursts"]


@pytest.mark.parametrize("tokens", [0, 1, 40, 200, 5000])
def test_the_protocol_benchmark_counts_a_one_request_burst_as_it_travels(tokens: int) -> None:
    from starsd.bench.protocol import FRAMING_BYTES, on_the_wire

    req = request(1, tokens=list(range(tokens)))
    answer = pb.ProposeResponse(session_id=1, seq=1, token_ids=list(range(tokens)))
    assert on_the_wire(req.ByteSize()) == pb.ProposeBurst(requests=[req]).ByteSize() + FRAMING_BYTES
    assert on_the_wire(answer.ByteSize()) == pb.ProposeBurstReply(responses=[answer]).ByteSize() + FRAMING_BYTES
