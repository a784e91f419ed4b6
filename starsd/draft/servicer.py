"""gRPC adapter of the draft: converts messages and streams, nothing more (the logic is in core.py).

``Propose`` carries one request or answer per message; ``ProposeBursts`` carries a target's burst (the requests
of one verification step) in one message and the answers ready together in one reply. Both feed the same
:class:`~starsd.draft.core.Stream`, so sessions, ordering and errors are the same on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

import grpc

from starsd.draft.core import DraftCore, Stream, StreamAborted
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

M = TypeVar("M", pb.ProposeResponse, pb.ProposeBurstReply)  # a message the draft sends on a stream


async def burst_requests(bursts: AsyncIterator[pb.ProposeBurst]) -> AsyncIterator[pb.ProposeRequest]:
    """A burst's requests one by one, each saying how many of its burst follow it (``following``)."""
    async for burst in bursts:
        count = len(burst.requests)
        for i, req in enumerate(burst.requests):
            req.following = count - i - 1
            yield req


def one_answer(
    outgoing: asyncio.Queue[pb.ProposeResponse | None], first: pb.ProposeResponse
) -> tuple[pb.ProposeResponse, bool]:
    """``Propose``'s message: one answer at a time."""
    return first, False


def ready_answers(
    outgoing: asyncio.Queue[pb.ProposeResponse | None], first: pb.ProposeResponse
) -> tuple[pb.ProposeBurstReply, bool]:
    """``first`` and every answer already queued behind it, as one reply; whether the stream's end was queued
    among them (it is taken from the queue: nothing follows it)."""
    reply = pb.ProposeBurstReply(responses=[first])
    while not outgoing.empty():
        response = outgoing.get_nowait()
        if response is None:
            return reply, True
        reply.responses.append(response)
    return reply, False


class DraftServicer(pb_grpc.DraftServicer):
    def __init__(self, core: DraftCore) -> None:
        self.core = core

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        info = self.core.proposer.info
        load = self.core.load.snapshot(targets=len(self.core.streams), queue_depth=len(self.core.buffer))
        return pb.InfoResponse(
            model_name=info.model_name,
            vocab_size=info.vocab_size,
            vocab_fingerprint=info.vocab_fingerprint,
            max_context=info.max_context,
            max_gamma=self.core.config.max_gamma,
            max_sessions=self.core.config.max_sessions,
            utilization=load.utilization,
            sessions=len(self.core.sessions),
            targets=len(self.core.streams),
            bursts=True,
        )

    async def Propose(
        self, request_iterator: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResponse]:
        async with contextlib.aclosing(self._serve(request_iterator, context, one_answer)) as responses:
            async for response in responses:
                yield response

    async def ProposeBursts(
        self, request_iterator: AsyncIterator[pb.ProposeBurst], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeBurstReply]:
        served = self._serve(burst_requests(request_iterator), context, ready_answers)
        async with contextlib.aclosing(served) as replies:  # closed with the call: its sessions are freed at once
            async for reply in replies:
                yield reply

    async def _serve(
        self,
        requests: AsyncIterator[pb.ProposeRequest],
        context: grpc.aio.ServicerContext,
        reply: Callable[[asyncio.Queue[pb.ProposeResponse | None], pb.ProposeResponse], tuple[M, bool]],
    ) -> AsyncGenerator[M, None]:
        """One target's stream: admit its requests, send each answer as ``reply`` makes it into a message (with
        whether it took the stream's end), end the call when the stream ends (aborted if it was malformed)."""
        stream = self.core.open_stream(asyncio.get_running_loop())
        aborted: list[str] = []
        reader = asyncio.create_task(self._read(stream, requests, aborted))
        try:
            ended = False
            while not ended:
                response = await stream.outgoing.get()
                if response is None:
                    break
                message, ended = reply(stream.outgoing, response)
                yield message
            if aborted:
                log.warning("aborting a stream from %r: %s", stream.target_id or "?", aborted[0])
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, aborted[0])
        finally:
            reader.cancel()
            self.core.close_stream(stream)

    async def _read(self, stream: Stream, requests: AsyncIterator[pb.ProposeRequest], aborted: list[str]) -> None:
        """Admit the stream's requests until its input ends (``aborted`` gets the reason if it is malformed)."""
        try:
            async for req in requests:
                self.core.submit(stream, req)
        except StreamAborted as exc:
            aborted.append(str(exc))
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        finally:
            stream.input_ended(aborted=bool(aborted))
