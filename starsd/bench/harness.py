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
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

from starsd import procfs
from starsd.bench.emulated import EmulatedTarget, TargetRun
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

CONNECT_SECONDS = 30.0  # how long emulated targets may take to open their streams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftEndpoint:
    address: str  # host:port of the gRPC service
    info: pb.InfoResponse  # its vocabulary and model, as a target checks them before it connects
    load_url: str | None = None  # http://host:port/v1/load
    pid: int | None = None  # the local process, when the benchmark started it

    @property
    def metrics_url(self) -> str | None:
        return self.load_url.removesuffix("/v1/load") + "/metrics" if self.load_url else None


@contextlib.asynccontextmanager
async def local_draft(
    model: Path | None = None, emulate: float | None = None, args: Sequence[str] = ()
) -> AsyncIterator[DraftEndpoint]:
    """``starsd draft`` on a checkpoint (``model``) or emulating a service time, plus ``args``, on free loopback
    ports; stopped on exit."""
    from starsd.local import LocalStar, StartError

    if (model is None) == (emulate is None):
        raise ValueError("a benchmark's draft needs exactly one of a checkpoint and an emulated service time")
    with tempfile.TemporaryDirectory(prefix="starsd-bench-") as logs:
        star = LocalStar(
            draft_model=model, emulate_service_time=emulate, targets=0, draft_args=list(args), log_dir=Path(logs)
        )
        try:
            await asyncio.to_thread(star.start)
        except StartError as exc:
            raise RuntimeError(str(exc)) from None
        try:
            pid = star.draft.popen.pid if star.draft and star.draft.popen else None
            yield await reach_draft(star.draft_address, star.load_url, pid)
        finally:
            await asyncio.to_thread(star.stop)


async def draft_info(address: str, timeout: float = 10.0) -> pb.InfoResponse:
    """The draft's vocabulary and model, as a target checks them before it connects."""
    async with grpc.aio.insecure_channel(address) as channel:
        info: pb.InfoResponse = await pb_grpc.DraftStub(channel).Info(pb.InfoRequest(), timeout=timeout)
        return info


async def reach_draft(
    address: str, load_url: str | None = None, pid: int | None = None, timeout: float = 30.0
) -> DraftEndpoint:
    """The endpoint of a serving draft, once it answers :func:`draft_info` (RuntimeError if it does not)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return DraftEndpoint(address, await draft_info(address, timeout=2.0), load_url, pid)
        except grpc.aio.AioRpcError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the draft at {address} did not answer in {timeout:.0f} s: {exc.details()}"
                ) from None
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class Reading:
    """What a benchmark reads at each end of its window."""

    wall: float  # time.perf_counter(), half-way through the reads
    cpu: float  # this process's CPU seconds (the emulated targets')
    draft_cpu: float | None  # the draft process's (and its model process's), when it runs here
    load: dict[str, Any] | None  # the draft's /v1/load, when it could be read
    samples: dict[str, float]  # DRAFT_SAMPLES from its /metrics

    def since(self, start: Reading) -> Reading:
        """What changed from ``start`` to this one: ``wall`` and the CPU seconds as spans, ``load`` this one's."""
        draft_cpu = None if self.draft_cpu is None or start.draft_cpu is None else self.draft_cpu - start.draft_cpu
        samples = {k: v - start.samples[k] for k, v in self.samples.items() if k in start.samples}
        return Reading(self.wall - start.wall, self.cpu - start.cpu, draft_cpu, self.load, samples)


async def read_draft(endpoint: DraftEndpoint) -> Reading:
    """Read the draft's /v1/load and /metrics, and the CPU seconds of both processes."""
    before = time.perf_counter()
    load, samples = None, {}
    if endpoint.load_url and endpoint.metrics_url:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
                async with http.get(endpoint.load_url) as resp:
                    resp.raise_for_status()
                    load = json.loads(await resp.text())
                async with http.get(endpoint.metrics_url) as resp:
                    samples = parse_metrics(await resp.text(), DRAFT_SAMPLES)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("cannot read the draft's load at %s: %s", endpoint.load_url, exc)
    wall = (before + time.perf_counter()) / 2
    draft_cpu = procfs.cpu_seconds(endpoint.pid) if endpoint.pid else None
    return Reading(wall, time.process_time(), draft_cpu, load, samples)


@dataclass
class Window:
    """The records of one measured window: every target's rounds, and the probe read at both ends."""

    runs: list[TargetRun]
    t0: float  # time.perf_counter() of this process
    t1: float
    before: Reading | None = None  # read_draft() at both ends, when the window had a draft endpoint
    after: Reading | None = None
    loop_lags: list[float] = field(default_factory=list)

    @property
    def change(self) -> Reading | None:
        """The probe's change across the window (None without a draft endpoint)."""
        return self.after.since(self.before) if self.after and self.before else None

    @property
    def errors(self) -> list[str]:
        return [f"{run.target_id}: {run.error}" for run in self.runs if run.error]


async def run_window(
    make: Callable[[int], EmulatedTarget],
    count: int,
    warmup: float,
    duration: float,
    draft: DraftEndpoint | None = None,
    strict: bool = True,
) -> Window:
    """Connect ``count`` targets (``make(i)``), measure ``[warmup, warmup + duration)``, stop them; with
    ``draft``, read it at both ends of the window (:func:`read_draft`).

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
        before = await read_draft(draft) if draft else None
        t0 = time.perf_counter()
        await asyncio.sleep(max(0.0, begun + warmup + duration - t0))
        t1 = time.perf_counter()
        after = await read_draft(draft) if draft else None
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


def parse_metrics(text: str, names: Sequence[str]) -> dict[str, float]:
    """The values of the named unlabelled samples in Prometheus text."""
    families = text_string_to_metric_families(text)
    return {x.name: x.value for f in families for x in f.samples if x.name in names and not x.labels}


DRAFT_SAMPLES = (
    "starsd_draft_batch_size_sum",
    "starsd_draft_batch_size_count",
    "starsd_draft_busy_seconds_total",
)
