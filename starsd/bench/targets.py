"""Emulated targets: real gRPC clients of the draft whose verify time and acceptance follow a profile.

Every target keeps one bidirectional ``Propose`` stream (its own channel and TCP connection, as separate
target nodes would) and loops: send the committed tokens, wait for the proposal, draw how many of the
``gamma`` proposed tokens are accepted (position by position, ``beta(y)`` each), "verify" by sleeping for the
profile's verify time plus the emulated wire delay, commit ``accepted + 1`` tokens, send again. Token ids are
not looked at: acceptance is drawn, so a target costs a few hundred microseconds of CPU per round and 64 of
them share one asyncio loop on one core.

Timing: asyncio's timers fire up to a millisecond late (epoll's resolution), which would lengthen every
emulated verify. Each target therefore corrects its sleeps by the lateness it has seen (an integral
controller), so its *mean* verify time equals the profile's; what is left is jitter, not bias.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

_session_ids = itertools.count(1)
_MAX_CORRECTION = 0.001  # seconds: about epoll's timer resolution


async def exchange(call: Any, request: pb.ProposeRequest, timeout: float) -> pb.ProposeResponse:
    """Send one request on a Propose stream and read its answer; a closed stream or an error raises."""
    await call.write(request)
    async with asyncio.timeout(timeout):  # cheaper than wait_for: no task per read
        response = await call.read()
    if response is grpc.aio.EOF:
        raise RuntimeError("the draft closed the stream")
    assert isinstance(response, pb.ProposeResponse)
    if response.error_code:
        raise RuntimeError(f"draft error {response.error_code}: {response.error_message}")
    return response


async def end_stream(call: Any, target_id: str, session: int, seq: int, timeout: float) -> None:
    """Free the open session (if it was opened: ``seq > 1``), close the writing side, drain the answers."""
    if seq > 1:
        await call.write(pb.ProposeRequest(target_id=target_id, session_id=session, seq=seq, release=True))
    await call.done_writing()
    async with asyncio.timeout(timeout):
        while await call.read() is not grpc.aio.EOF:
            pass


@dataclass(frozen=True)
class TargetSpec:
    """What every emulated target of a run does."""

    gamma: int
    betas: tuple[float, ...]  # beta(1..gamma): P(position y accepted | 1..y-1 accepted)
    verify_seconds: float  # Tp
    wire_seconds: float  # one-way transfer added by emulation (Tc of the profile), each way
    vocab_size: int
    prompt_tokens: int = 16
    session_tokens: int = 512  # a session (one client completion) ends after this many tokens
    timeout: float = 30.0  # longest wait for one proposal before the target gives up
    max_num_seqs: int = 1  # an emulated target runs one session at a time: its demand report is 1 of this

    def __post_init__(self) -> None:
        if len(self.betas) != self.gamma or not all(0.0 <= b <= 1.0 for b in self.betas):
            raise ValueError("betas must hold gamma probabilities")
        if self.verify_seconds < 0 or self.wire_seconds < 0 or self.vocab_size < 2:
            raise ValueError("times must be >= 0 and the vocabulary must hold at least 2 ids")


@dataclass(frozen=True)
class Round:
    """One round of one target (``time.perf_counter`` seconds)."""

    sent: float  # request written to the stream
    received: float  # proposal read from the stream
    committed: float  # verify done: ``tokens`` committed
    tokens: int  # accepted + 1
    accepted: int
    service: float  # the draft's compute time for this request, as it reported


@dataclass
class TargetRun:
    target_id: str
    rounds: list[Round] = field(default_factory=list)
    verify_actual: list[float] = field(default_factory=list)  # seconds slept per round (verify + wire)
    sessions: int = 0
    error: str | None = None


def draw_accepted(rng: random.Random, betas: Sequence[float]) -> int:
    """Accepted drafts in one round: position y is accepted with ``beta(y)`` once 1..y-1 were."""
    accepted = 0
    for beta in betas:
        if rng.random() >= beta:
            break
        accepted += 1
    return accepted


class EmulatedTarget:
    def __init__(self, target_id: str, channel: grpc.aio.Channel, spec: TargetSpec, seed: int) -> None:
        self.target_id = target_id
        self.stub = pb_grpc.DraftStub(channel)
        self.spec = spec
        self.rng = random.Random(seed)
        self.run_record = TargetRun(target_id)
        self._late = 0.0  # how much earlier than wanted to ask asyncio to wake us (learned)

    def _prompt(self) -> list[int]:
        return [self.rng.randrange(self.spec.vocab_size) for _ in range(self.spec.prompt_tokens)]

    async def _sleep_exactly(self, seconds: float) -> float:
        """Sleep ``seconds`` on average despite late timers; returns the time actually slept."""
        start = time.perf_counter()
        await asyncio.sleep(max(0.0, seconds - self._late))
        actual = time.perf_counter() - start
        # Learn the timer's systematic lateness only: a stall of the whole process (another job took the
        # CPU) is clipped, so it shows in the measurements instead of being repaid by short sleeps later.
        error = min(max(actual - seconds, -_MAX_CORRECTION), _MAX_CORRECTION)
        self._late = min(max(0.0, self._late + 0.2 * error), seconds)
        return actual

    async def run(self, stop: asyncio.Event) -> TargetRun:
        """Rounds until ``stop`` is set; the round in flight finishes, then the session is released."""
        spec, record = self.spec, self.run_record
        call = self.stub.Propose()
        session = next(_session_ids)
        seq, committed = 1, 0
        tokens = self._prompt()
        verify_reported = rtt_reported = 0.0
        try:
            while not stop.is_set():
                request = pb.ProposeRequest(
                    target_id=self.target_id,
                    session_id=session,
                    seq=seq,
                    tokens=tokens,
                    gamma=spec.gamma,
                    temperature=0.0,
                    verify_seconds=verify_reported,
                    rtt_seconds=rtt_reported,
                    running_requests=1,
                    occupancy=1 / spec.max_num_seqs,
                )
                if seq == 1:
                    record.sessions += 1
                sent = time.perf_counter()
                response = await exchange(call, request, spec.timeout)
                received = time.perf_counter()
                if response.seq != seq or response.session_id != session:
                    raise RuntimeError(f"answer for seq {response.seq}, expected {seq}")
                proposed = list(response.token_ids)
                accepted = min(draw_accepted(self.rng, spec.betas), len(proposed))
                # Verify, plus the wire both ways (folded into one sleep: the draft is not involved).
                slept = await self._sleep_exactly(spec.verify_seconds + 2 * spec.wire_seconds)
                committed_at = time.perf_counter()
                record.verify_actual.append(slept)
                record.rounds.append(
                    Round(sent, received, committed_at, accepted + 1, accepted, float(response.service_seconds))
                )
                verify_reported = max(0.0, slept - 2 * spec.wire_seconds)
                rtt_reported = (received - sent) + 2 * spec.wire_seconds
                correction = self.rng.randrange(spec.vocab_size)
                tokens = [*proposed[:accepted], correction]
                committed += accepted + 1
                seq += 1
                if committed >= spec.session_tokens:  # this completion is done: the next one starts
                    await call.write(
                        pb.ProposeRequest(target_id=self.target_id, session_id=session, seq=seq, release=True)
                    )
                    session, seq, committed = next(_session_ids), 1, 0
                    tokens = self._prompt()
            await end_stream(call, self.target_id, session, seq, spec.timeout)
        except (grpc.aio.AioRpcError, RuntimeError, TimeoutError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            call.cancel()
        return record


async def loop_lag_monitor(stop: asyncio.Event, period: float = 0.005) -> list[float]:
    """How late the event loop wakes a ``period`` timer: a loop saturated by the targets shows here."""
    lags: list[float] = []
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - start - period)
    return lags


def open_channel(address: str) -> grpc.aio.Channel:
    # A subchannel pool of its own: each emulated target gets its own connection, like a separate node.
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


async def fetch_vocab_size(address: str, timeout: float = 10.0) -> int:
    async with open_channel(address) as channel:
        info = await pb_grpc.DraftStub(channel).Info(pb.InfoRequest(), timeout=timeout)
        return int(info.vocab_size)
