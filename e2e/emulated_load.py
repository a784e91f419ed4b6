"""Emulated targets (starsd.bench) keeping sessions going through a real draft process, from a background
thread's event loop: the load the rebalancer scenarios read from the draft's /v1/load."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from starsd.bench.emulated import EmulatedTarget, TargetRun, TargetSpec
from starsd.bench.harness import draft_info

VERIFY_SECONDS = 0.1  # Tp; with the draft's emulated Tq = 4 ms, N* = ceil(1 + 0.1/0.004) = 26


class EmulatedLoad:
    """Emulated targets driving a draft from a background thread's event loop until stopped."""

    def __init__(self, address: str, sessions: int, max_num_seqs: int = 1) -> None:
        self.address = address
        self.sessions = sessions
        self.max_num_seqs = max_num_seqs  # each target runs one session: it reports 1 / max_num_seqs occupancy
        self.stop_event: asyncio.Event | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.future: concurrent.futures.Future[list[TargetRun]] | None = None

    async def _run(self) -> list[TargetRun]:
        self.stop_event = asyncio.Event()
        info = await draft_info(self.address)
        spec = TargetSpec(
            gamma=4,
            betas=(0.8, 0.8, 0.8, 0.8),
            verify_seconds=VERIFY_SECONDS,
            wire_seconds=0.0,
            vocab_size=int(info.vocab_size),
            max_num_seqs=self.max_num_seqs,
        )
        targets = [EmulatedTarget(f"e2e-{i}", self.address, info, spec, seed=i) for i in range(self.sessions)]
        await asyncio.gather(*(t.connect(30.0) for t in targets))
        return list(await asyncio.gather(*(t.run(self.stop_event) for t in targets)))

    def start(self) -> None:
        self.thread.start()
        self.future = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    def stop(self) -> list[TargetRun]:
        assert self.future is not None, "not started"
        if self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        try:
            runs = self.future.result(timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        return list(runs)
