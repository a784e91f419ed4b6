"""What every ``starsd bench`` run shares: a real draft on loopback, emulated targets on it, a measured window.

* :func:`local_draft` starts ``starsd draft`` (a checkpoint, or the emulated proposer) as its own process with
  :class:`starsd.local.LocalStar`, the launcher ``starsd local`` and the tests use, and stops it afterwards.
* :func:`run_window` connects ``count`` emulated targets (:mod:`starsd.bench.emulated`), lets them run for a
  warm-up, reads a probe at both ends of the measured window, then stops them and returns their records.
* Probes: the draft's ``/v1/load`` and ``/metrics``, and CPU seconds from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from starsd import procfs
from starsd.bench.emulated import EmulatedTarget, TargetRun
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

SERVICE_NAME = "starsd.v1.Draft"
CONNECT_SECONDS = 30.0  # how long emulated targets may take to open their streams

T = TypeVar("T")


@dataclass(frozen=True)
class DraftEndpoint:
    address: str  # host:port of the gRPC service
    load_url: str | None  # http://host:port/v1/load
    pid: int | None = None  # the local process, when the benchmark started it

    @property
    def metrics_url(self) -> str | None:
        return self.load_url.removesuffix("/v1/load") + "/metrics" if self.load_url else None


def draft_source(draft_args: Sequence[str]) -> tuple[Path | None, float | None, list[str]]:
    """Split ``starsd draft`` flags into (``--model``, ``--emulate-service-time``, the rest)."""
    args, model, emulated = list(draft_args), None, None
    for flag in ("--model", "--emulate-service-time"):
        if flag in args:
            i = args.index(flag)
            value = args[i + 1]
            del args[i : i + 2]
            if flag == "--model":
                model = Path(value)
            else:
                emulated = float(value)
    if (model is None) == (emulated is None):
        raise ValueError("a benchmark's draft needs exactly one of --model and --emulate-service-time")
    return model, emulated, args


@contextlib.asynccontextmanager
async def local_draft(draft_args: Sequence[str]) -> AsyncIterator[DraftEndpoint]:
    """``starsd draft DRAFT_ARGS`` (with ``--model`` or ``--emulate-service-time``) on free loopback ports."""
    from starsd.local import LocalStar, StartError

    model, emulated, rest = draft_source(draft_args)
    with tempfile.TemporaryDirectory(prefix="starsd-bench-") as logs:
        star = LocalStar(
            draft_model=model, emulate_service_time=emulated, targets=0, draft_args=rest, log_dir=Path(logs)
        )
        try:
            await asyncio.to_thread(star.start)
        except StartError as exc:
            raise RuntimeError(str(exc)) from None
        try:
            pid = star.draft.popen.pid if star.draft and star.draft.popen else None
            yield DraftEndpoint(star.draft_address, star.load_url, pid)
        finally:
            await asyncio.to_thread(star.stop)


async def wait_until_serving(address: str, timeout: float) -> None:
    """Poll grpc health checking until a draft that is already running reports SERVING (RuntimeError if not)."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the draft at {address} was not serving after {timeout:.0f} s")
            await asyncio.sleep(0.2)


async def draft_info(address: str, timeout: float = 10.0) -> pb.InfoResponse:
    """The draft's vocabulary and model, as a target checks them before it connects."""
    async with grpc.aio.insecure_channel(address) as channel:
        info: pb.InfoResponse = await pb_grpc.DraftStub(channel).Info(pb.InfoRequest(), timeout=timeout)
        return info


@dataclass
class Window(Generic[T]):
    """The records of one measured window: every target's rounds, and the probe read at both ends."""

    runs: list[TargetRun]
    t0: float  # time.perf_counter() of this process
    t1: float
    before: T | None = None
    after: T | None = None
    loop_lags: list[float] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [f"{run.target_id}: {run.error}" for run in self.runs if run.error]


async def run_window(
    make: Callable[[int], EmulatedTarget],
    count: int,
    warmup: float,
    duration: float,
    probe: Callable[[], Awaitable[T]] | None = None,
    strict: bool = True,
) -> Window[T]:
    """Connect ``count`` targets (``make(i)``), measure ``[warmup, warmup + duration)``, stop them.

    With ``strict``, a target that failed (its draft missed a round, or the stream broke) fails the window.
    """
    targets = [make(i) for i in range(count)]
    connected = await asyncio.gather(*(t.connect(CONNECT_SECONDS) for t in targets), return_exceptions=True)
    failed = [c for c in connected if isinstance(c, BaseException)]
    if failed:
        await asyncio.gather(*(t.close() for t in targets))
        raise RuntimeError(f"{len(failed)} of {count} targets could not connect, e.g. {failed[0]}")
    stop = asyncio.Event()
    lag_task = asyncio.create_task(loop_lag_monitor(stop, period=0.02))
    tasks = [asyncio.create_task(t.run(stop)) for t in targets]
    try:
        begun = time.perf_counter()
        await asyncio.sleep(warmup)
        before = await probe() if probe else None
        t0 = time.perf_counter()
        await asyncio.sleep(max(0.0, begun + warmup + duration - t0))
        t1 = time.perf_counter()
        after = await probe() if probe else None
    finally:
        stop.set()  # every target finishes its round in flight and releases its session
        runs = list(await asyncio.gather(*tasks))
        lags = await lag_task
    window = Window(runs, t0, t1, before, after, lags)
    if strict and window.errors:
        raise RuntimeError(f"{len(window.errors)} targets failed, e.g. {window.errors[0]}")
    return window


def window_counts(runs: Sequence[TargetRun], start: float, end: float) -> tuple[int, int]:
    """(rounds, committed tokens) of ``runs`` whose round was committed inside ``[start, end)``."""
    rounds = tokens = 0
    for run in runs:
        for r in run.rounds:
            if start <= r.committed < end:
                rounds += 1
                tokens += r.tokens
    return rounds, tokens


async def loop_lag_monitor(stop: asyncio.Event, period: float = 0.005) -> list[float]:
    """How late the event loop wakes a ``period`` timer: a loop saturated by the targets shows here."""
    lags: list[float] = []
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - start - period)
    return lags


async def read_load(session: aiohttp.ClientSession, url: str) -> tuple[float, dict[str, Any]]:
    """GET /v1/load; returns (the local time half-way through the request, the JSON)."""
    before = time.perf_counter()
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        resp.raise_for_status()
        data = json.loads(await resp.text())
    return (before + time.perf_counter()) / 2, data


def parse_metrics(text: str, names: Sequence[str]) -> dict[str, float]:
    """The values of the named samples in Prometheus text (``name value`` lines, no labels)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in wanted:
            out[parts[0]] = float(parts[1])
    return out


DRAFT_SAMPLES = (
    "starsd_draft_batch_size_sum",
    "starsd_draft_batch_size_count",
    "starsd_draft_busy_seconds_total",
)


def metrics_probe(endpoint: DraftEndpoint) -> Callable[[], Awaitable[dict[str, float]]]:
    """Reads the draft's batch and busy counters from /metrics, its CPU seconds from /proc, and the clock."""

    async def probe() -> dict[str, float]:
        values: dict[str, float] = {}
        if endpoint.metrics_url:
            async with (
                aiohttp.ClientSession() as http,
                http.get(endpoint.metrics_url, timeout=aiohttp.ClientTimeout(total=5)) as resp,
            ):
                values = parse_metrics(await resp.text(), DRAFT_SAMPLES)
        cpu = procfs.cpu_seconds(endpoint.pid) if endpoint.pid else None
        if cpu is not None:
            values["cpu_seconds"] = cpu
        values["wall_seconds"] = time.perf_counter()
        return values

    return probe


def differences(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """``after - before`` for every key read at both ends."""
    if before is None or after is None:
        return {}
    return {k: after[k] - before[k] for k in after if k in before}
