"""The real draft server as the benchmark runs it: a separate process, health-checked, its load read over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from starsd import procfs

SERVICE_NAME = "starsd.v1.Draft"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of the draft process and its model process; None where unavailable."""
    return procfs.cpu_seconds(pid)


@dataclass
class DraftEndpoint:
    address: str  # host:port of the gRPC service
    load_url: str | None  # http://host:port/v1/load
    pid: int | None = None  # the local process, when the benchmark started it


class DraftProcess:
    """``starsd draft --emulate-service-time ...`` (or ``--model``) on free loopback ports."""

    def __init__(self, extra_args: list[str], startup_timeout: float = 120.0) -> None:
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def endpoint(self) -> DraftEndpoint:
        return DraftEndpoint(
            address=f"127.0.0.1:{self.port}",
            load_url=f"http://127.0.0.1:{self.metrics_port}/v1/load",
            pid=self.proc.pid if self.proc else None,
        )

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "starsd.cli",
            "--log-level",
            "WARNING",
            "draft",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            *self.extra_args,
        ]

    async def start(self) -> DraftEndpoint:
        fd, name = tempfile.mkstemp(prefix="starsd-bench-draft-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        await wait_until_serving(self.endpoint.address, self.startup_timeout, self)
        return self.endpoint

    def exited(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._log:
            self._log.close()
            self._log = None
        if self.log_path:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


async def wait_until_serving(address: str, timeout: float, process: DraftProcess | None = None) -> None:
    """Poll grpc health checking until the draft service is SERVING (RuntimeError on exit or timeout)."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process is not None and process.exited() is not None:
                raise RuntimeError(f"the draft exited with code {process.exited()}:\n{process.log_tail()}")
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                tail = process.log_tail() if process else ""
                raise RuntimeError(f"the draft at {address} was not serving after {timeout:.0f} s\n{tail}")
            await asyncio.sleep(0.2)


async def read_load(session: aiohttp.ClientSession, url: str) -> tuple[float, dict[str, Any]]:
    """GET /v1/load; returns (the local time half-way through the request, the JSON)."""
    before = time.perf_counter()
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        resp.raise_for_status()
        data = json.loads(await resp.text())
    return (before + time.perf_counter()) / 2, data
