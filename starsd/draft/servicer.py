"""gRPC adapter of the draft: converts messages and streams, nothing more (the logic is in core.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from starsd.draft.core import DraftCore, StreamAborted
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


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
        )

    async def Propose(
        self, request_iterator: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResponse]:
        stream = self.core.open_stream(asyncio.get_running_loop())
        aborted: list[str] = []

        async def read() -> None:
            try:
                async for req in request_iterator:
                    self.core.submit(stream, req)
            except StreamAborted as exc:
                aborted.append(str(exc))
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass
            finally:
                stream.input_ended(aborted=bool(aborted))

        reader = asyncio.create_task(read())
        try:
            while True:
                response = await stream.outgoing.get()
                if response is None:
                    break
                yield response
            if aborted:
                log.warning("aborting a stream from %r: %s", stream.target_id or "?", aborted[0])
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, aborted[0])
        finally:
            reader.cancel()
            self.core.close_stream(stream)
