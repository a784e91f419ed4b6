"""A completion's link to the draft over real gRPC on loopback: the client opens its channels through the factory
it was given, and an answer that cannot be verified is counted once, by the client's callback, and the round
decodes alone (no flag for the caller to clear)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from starsd.sampling import SamplingParams
from starsd.verifier.draft_client import DraftClient, DraftClientOptions
from starsd.verifier.draft_link import DraftLink

VOCAB = 100
WAIT = 30.0  # seconds a condition may take on a loaded machine before the test fails


class OutOfRangeDraft(pb_grpc.DraftServicer):
    """Answers every other request with ids outside the vocabulary, the others well formed."""

    def __init__(self) -> None:
        self.answered = 0

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        return pb.InfoResponse(model_name="odd", vocab_size=VOCAB, vocab_fingerprint="fp", max_context=1024)

    def answer(self, req: pb.ProposeRequest) -> pb.ProposeResponse:
        self.answered += 1
        token = VOCAB + 5 if self.answered % 2 else 3
        return pb.ProposeResponse(session_id=req.session_id, seq=req.seq, token_ids=[token] * req.gamma)

    async def Propose(
        self, requests: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResponse]:
        async for req in requests:
            if not req.release:  # a release is answered by nothing
                yield self.answer(req)


def test_an_unverifiable_answer_is_counted_by_the_client_and_the_round_decodes_alone() -> None:
    async def scenario() -> tuple[list[list[int] | None], int, list[str]]:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        pb_grpc.add_DraftServicer_to_server(OutOfRangeDraft(), server)
        await server.start()
        opened: list[str] = []

        def channel(address: str) -> grpc.aio.Channel:
            opened.append(address)
            return grpc.aio.insecure_channel(address)

        client = DraftClient(f"127.0.0.1:{port}", "t-0", "fp", VOCAB, DraftClientOptions(), channel=channel)
        malformed = 0

        def counted() -> None:
            nonlocal malformed
            malformed += 1

        client.on_malformed = counted
        client.start()
        try:
            end = asyncio.get_running_loop().time() + WAIT
            while not client.connected:
                assert asyncio.get_running_loop().time() < end, "the client did not connect"
                await asyncio.sleep(0.02)
            link = DraftLink(client, SamplingParams(), seed=1)
            answers = []
            for committed in ([1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5]):
                proposal = await link.propose(committed, gamma=2, verify_seconds=0.0)
                answers.append(None if proposal is None else proposal.token_ids)
            return answers, malformed, opened
        finally:
            await client.stop()
            await server.stop(None)

    answers, malformed, opened = asyncio.run(scenario())
    assert answers == [None, [3, 3], None, [3, 3]]
    assert malformed == 2
    assert opened and all(a.startswith("127.0.0.1:") for a in opened)


def test_a_round_cancelled_as_its_answer_arrives_stays_cancelled() -> None:
    """A client that leaves cancels its completion's round; when the draft's answer lands in the same turn of the
    event loop, the round must still end (Python 3.11's asyncio.wait_for returned the answer instead, and the
    completion generated on to max_tokens for a client that was gone)."""

    async def scenario() -> tuple[bool, int]:
        client = DraftClient("127.0.0.1:1", "t-0", "fp", VOCAB, DraftClientOptions())  # never started: no stream
        answer: asyncio.Future[pb.ProposeResponse | None] = asyncio.get_running_loop().create_future()
        sent: list[pb.ProposeRequest] = []

        def send(req: pb.ProposeRequest) -> asyncio.Future[pb.ProposeResponse | None]:
            sent.append(req)
            return answer

        client.send = send  # type: ignore[method-assign]
        client.connected = True
        link = DraftLink(client, SamplingParams(), seed=1)
        round_ = asyncio.create_task(link.propose([1, 2], gamma=2, verify_seconds=0.0))
        while not sent:
            await asyncio.sleep(0)
        req = sent[0]
        answer.set_result(pb.ProposeResponse(session_id=req.session_id, seq=req.seq, token_ids=[3, 3]))
        round_.cancel()  # the same turn: the answer's wake-up is queued, not yet run
        try:
            await round_
        except asyncio.CancelledError:
            return True, len(sent)
        return False, len(sent)

    cancelled, requests = asyncio.run(scenario())
    assert requests == 1
    assert cancelled, "the round returned its answer to a cancelled completion"


def test_stopping_the_client_does_not_swallow_the_callers_own_cancellation() -> None:
    """stop() cancels the client's tasks and waits for them; when the caller is cancelled meanwhile (a shutdown
    under a time limit), the caller's cancellation must reach it, not be taken for the tasks' own."""

    async def scenario() -> tuple[bool, bool]:
        client = DraftClient("127.0.0.1:1", "t-0", "fp", VOCAB, DraftClientOptions())  # never started
        cleaning = asyncio.Event()

        async def slow_to_stop() -> None:  # a task that cleans up for a while once cancelled
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cleaning.set()
                await asyncio.sleep(0.2)
                raise

        client._task = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        stopping = asyncio.create_task(client.stop())
        await cleaning.wait()
        stopping.cancel()
        try:
            await stopping
        except asyncio.CancelledError:
            caller_cancelled = True
        else:
            caller_cancelled = False
        await asyncio.wait({client._task})
        return caller_cancelled, client._task.cancelled()

    caller_cancelled, task_cancelled = asyncio.run(scenario())
    assert caller_cancelled, "stop() swallowed its caller's cancellation"
    assert task_cancelled


def test_stopping_the_client_waits_for_its_tasks_and_logs_one_that_had_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> bool:
        client = DraftClient("127.0.0.1:1", "t-0", "fp", VOCAB, DraftClientOptions())

        async def broken() -> None:
            raise RuntimeError("the stream broke")

        client._task = asyncio.create_task(broken())
        lingering = asyncio.create_task(asyncio.sleep(3600))
        client._discovering = lingering
        await asyncio.sleep(0)
        await client.stop()
        return lingering.cancelled()

    assert asyncio.run(scenario())
    assert "the stream broke" in caplog.text
