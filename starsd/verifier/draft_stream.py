"""One ``Propose`` stream from this target to one draft: opened after the draft's checks, its answers delivered.

:class:`starsd.verifier.draft_client.DraftClient` decides which draft to talk to and when to move; this module is
what it holds while it talks to one: the channel, the stream's request queue and the answers still owed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from starsd.verifier.draft_pool import has_room

log = logging.getLogger(__name__)

# Opens a channel to a draft's ``HOST:PORT`` (DraftClient's ``channel`` argument; a benchmark passes its own).
ChannelFactory = Callable[[str], grpc.aio.Channel]


class VocabularyMismatch(RuntimeError):
    """The draft serves another vocabulary: its proposals would be meaningless to this target."""


class NoRoom(RuntimeError):
    """The first-choice draft answered a probe but reports no room for another target."""


def check_draft_info(info: pb.InfoResponse, fingerprint: str, vocab_size: int) -> None:
    if info.vocab_fingerprint != fingerprint or info.vocab_size != vocab_size:
        raise VocabularyMismatch(
            f"the draft model {info.model_name!r} does not share this target's vocabulary "
            f"(draft: {info.vocab_size} ids, fingerprint {info.vocab_fingerprint}; "
            f"target: {vocab_size} ids, fingerprint {fingerprint}); use a draft trained with the same tokenizer"
        )


def channel_factory(root_certificates: bytes | None) -> ChannelFactory:
    """Channels with keepalive; TLS verified against ``root_certificates`` when given."""
    options = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]

    def open_channel(address: str) -> grpc.aio.Channel:
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            return grpc.aio.secure_channel(address, creds, options=options)
        return grpc.aio.insecure_channel(address, options=options)

    return open_channel


# The most request bytes one ProposeBurst carries: a burst beyond it goes as several messages (far below the
# draft's 4 MiB message limit, starsd.draft.server.MAX_MESSAGE_BYTES).
BURST_BYTES = 1 << 20


async def requests(queue: asyncio.Queue[pb.ProposeRequest | None]) -> AsyncIterator[pb.ProposeRequest]:
    """The stream's requests, in queue order, until a None (the half-close)."""
    while True:
        req = await queue.get()
        if req is None:
            return
        req.following = queue.qsize()  # the rest of this burst, already queued (see the proto)
        yield req


async def bursts(
    queue: asyncio.Queue[pb.ProposeRequest | None], limit: int = BURST_BYTES
) -> AsyncIterator[pb.ProposeBurst]:
    """The stream's requests as bursts: each message takes the next request and every one already queued behind
    it (a verification step queues its requests together), up to ``limit`` bytes; ends at a None."""
    while True:
        req = await queue.get()
        if req is None:
            return
        burst = pb.ProposeBurst(requests=[req])
        size = req.ByteSize()
        while not queue.empty():
            nxt = queue.get_nowait()
            if nxt is None:
                yield burst
                return
            size += nxt.ByteSize()
            if size > limit:
                yield burst
                burst, size = pb.ProposeBurst(), nxt.ByteSize()
            burst.requests.append(nxt)
        yield burst


async def answers(replies: AsyncIterator[pb.ProposeBurstReply]) -> AsyncIterator[pb.ProposeResponse]:
    """The answers of a ProposeBursts call one by one, in the order the draft sent them."""
    async for reply in replies:
        for response in reply.responses:
            yield response


@dataclass
class DraftStream:
    """One open Propose stream to one draft, with the answers it still owes."""

    rank: int
    address: str
    model_name: str
    channel: grpc.aio.Channel
    queue: asyncio.Queue[pb.ProposeRequest | None]
    call: AsyncIterator[pb.ProposeResponse]
    pending: dict[tuple[int, int], asyncio.Future[pb.ProposeResponse | None]] = field(default_factory=dict)

    def fail_pending(self) -> None:
        """Answer every request still owed with None (the rounds decode alone)."""
        for future in self.pending.values():
            if not future.done():
                future.set_result(None)
        self.pending.clear()

    def put(self, req: pb.ProposeRequest) -> asyncio.Future[pb.ProposeResponse | None]:
        """Queue a request; the future resolves with its answer (None for a release, or if the stream dies)."""
        future: asyncio.Future[pb.ProposeResponse | None] = asyncio.get_running_loop().create_future()
        if req.release:
            future.set_result(None)
        else:
            self.pending[(req.session_id, req.seq)] = future
        self.queue.put_nowait(req)
        return future

    async def read(self) -> str:
        """Deliver the stream's answers to their rounds; returns why the stream ended."""
        try:
            async for response in self.call:
                future = self.pending.pop((response.session_id, response.seq), None)
                if future is not None and not future.done():
                    future.set_result(response)
            return "the draft closed the stream"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # the connection loop must outlive any stream
            log.exception("the stream to the draft at %s failed", self.address)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.fail_pending()

    async def close(self) -> None:
        """Half-close, answer what is owed with None, close the channel."""
        self.queue.put_nowait(None)
        self.fail_pending()
        await self.channel.close(grace=None)


async def open_stream(
    channel: grpc.aio.Channel,
    rank: int,
    address: str,
    fingerprint: str,
    vocab_size: int,
    timeout: float,
    need_room: bool = False,
) -> DraftStream:
    """A new stream on ``channel`` (closed on failure), after the draft's vocabulary check (and, when moving
    back to it, its room check). Raises grpc.aio.AioRpcError, VocabularyMismatch or NoRoom."""
    try:
        stub = pb_grpc.DraftStub(channel)
        info = await stub.Info(pb.InfoRequest(), timeout=timeout)
        check_draft_info(info, fingerprint, vocab_size)
        if need_room and not has_room(info):
            raise NoRoom(
                f"the draft at {address} has no room (utilization {info.utilization:.2f}, "
                f"{info.sessions} of {info.max_sessions} sessions)"
            )
        queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()
        # A draft that serves bursts gets a step's requests in one message; an older one, one by one.
        call = answers(stub.ProposeBursts(bursts(queue))) if info.bursts else stub.Propose(requests(queue))
        return DraftStream(rank, address, info.model_name, channel, queue, call)
    except BaseException:
        await channel.close(grace=None)
        raise
