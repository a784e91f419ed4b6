"""Runs the draft: the gRPC service, grpc health checking, and the HTTP metrics port (/v1/load, /metrics)."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from starsd import defaults
from starsd.draft.core import DraftConfig, DraftCore
from starsd.draft.proposers import Proposer
from starsd.draft.servicer import DraftServicer
from starsd.proto import starsd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "starsd.v1.Draft"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class DraftServerOptions:
    host: str = "0.0.0.0"
    port: int = defaults.DRAFT_GRPC_PORT
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = defaults.DRAFT_METRICS_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    sweep_interval: float = 5.0


def build_metrics_app(core: DraftCore) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def load(_: web.Request) -> web.Response:
        snap = core.load.snapshot(targets=len(core.streams), queue_depth=len(core.buffer))
        info = core.proposer.info
        return web.json_response({**snap.to_json(), "device": info.device, "dtype": info.dtype})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(core.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)  # the model is loaded before the server starts
    app.router.add_get("/v1/load", load)
    app.router.add_get("/metrics", metrics)
    return app


class DraftServer:
    """The draft's servers around one :class:`DraftCore`; ``await start()`` then ``await stop()``."""

    def __init__(self, proposer: Proposer, config: DraftConfig, options: DraftServerOptions) -> None:
        self.core = DraftCore(proposer, config)
        self.options = options
        self.grpc_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._runner: web.AppRunner | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        opts = self.options
        self.core.start()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        pb_grpc.add_DraftServicer_to_server(DraftServicer(self.core), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"{opts.host}:{opts.port}"
        try:  # grpcio answers a port it cannot bind with 0 (older) or a RuntimeError (newer)
            if opts.tls_cert and opts.tls_key:
                creds = grpc.ssl_server_credentials([(opts.tls_key.read_bytes(), opts.tls_cert.read_bytes())])
                self.grpc_port = server.add_secure_port(address, creds)
            else:
                self.grpc_port = server.add_insecure_port(address)
        except RuntimeError:
            self.grpc_port = 0
        if self.grpc_port == 0:
            raise OSError(f"cannot listen on {address} (port in use?)")
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if opts.metrics_port is not None:
            self._runner = web.AppRunner(build_metrics_app(self.core), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, opts.metrics_host, opts.metrics_port)
            await site.start()
            bound = self._runner.addresses
            self.metrics_port = int(bound[0][1]) if bound else opts.metrics_port
        self._sweeper = asyncio.create_task(self._sweep_forever())
        info = self.core.proposer.info
        log.info(
            "draft %r on %s %s (%s) serving gRPC on %s:%d (metrics on %d), vocab %d, max batch %d, schedule %s",
            info.model_name,
            info.device,
            info.dtype,
            info.passes or "emulated",
            opts.host,
            self.grpc_port,
            self.metrics_port,
            info.vocab_size,
            self.core.config.max_batch,
            self.core.config.schedule,
        )

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.sweep_interval)
            freed = self.core.sweep()
            if freed:
                log.info("freed %d idle sessions", freed)

    async def stop(self, grace: float = 5.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self._sweeper:
            self._sweeper.cancel()
        if self._server:
            await self._server.stop(grace)
        if self._runner:
            await self._runner.cleanup()
        self.core.stop()


async def serve_forever(server: DraftServer) -> str | None:
    """Serve until SIGINT or SIGTERM (or until the model fails), then shut down gracefully.

    Returns why the draft failed, or None after a requested shutdown.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    signalled = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(server.core.failed.wait())
    await asyncio.wait([signalled, failed], return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    failed.cancel()
    log.info("shutting down the draft")
    await server.stop()
    return server.core.failure
