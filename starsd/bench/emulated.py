"""Emulated targets: the product's own target loop with an emulated model runner.

An emulated target is a real :class:`starsd.verifier.engine.TargetEngine` (the step scheduler, the generation
loop) talking to the draft through a real :class:`starsd.verifier.draft_client.DraftClient` and
:class:`starsd.verifier.draft_link.DraftLink` (one long-lived ``Propose`` stream, the real request fields, the
real fallback and adaptive gamma). Only the model is emulated: :class:`EmulatedTargetRunner` is a
:class:`starsd.verifier.step_runner.StepRunner` like :class:`starsd.verifier.runner.TargetRunner`, and its step
holds the model thread for the profile's verify time (releasing the GIL, as kernels do) and draws how many
drafts are accepted instead of computing logits. Token ids are not looked at, so a target costs a few hundred
microseconds of CPU per round.

The draft's side needs no emulation here: ``starsd draft --emulate-service-time`` is the real draft server and
draft core with an emulated proposer (:class:`starsd.draft.proposers.EmulatedProposer`).

Each emulated target runs one completion at a time (``session_tokens`` tokens, then the next one starts), so
its rounds are sequential; :class:`TargetRun` records each round's times (request sent, proposal received,
verify done) as the benchmarks' analysis needs them.

Timing: a thread's sleep wakes a little late (timer slack), which would lengthen every emulated verify. Each
runner corrects its holds by the lateness it has seen (an integral controller), so its *mean* verify time
equals the profile's; what is left is jitter, not bias.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import torch

from starsd.checkpoints import LoadedModel
from starsd.proto import starsd_pb2 as pb
from starsd.sampling import SamplingParams
from starsd.verifier.draft_client import DraftClient, DraftClientOptions
from starsd.verifier.engine import BatchOptions, GenerationStats, TargetEngine
from starsd.verifier.runner import RowOutcome, StepRow, TargetSession, commit

_MAX_CORRECTION = 0.001  # seconds: the most one hold's lateness may move the correction

Acceptance = Callable[[int], int]  # drafts offered in a round -> drafts accepted


@dataclass(frozen=True)
class TargetSpec:
    """What every emulated target of a run does."""

    gamma: int  # drafts per round; with ``adaptive``, the most a round asks for
    betas: tuple[float, ...]  # beta(1..gamma): P(position y accepted | 1..y-1 accepted)
    verify_seconds: float  # Tp
    wire_seconds: float  # one-way transfer added by emulation (Tc of the profile), each way
    vocab_size: int
    prompt_tokens: int = 16
    session_tokens: int = 512  # a session (one client completion) ends after this many tokens
    timeout: float = 30.0  # longest wait for one proposal: a round that waits longer decodes alone (an error)
    max_num_seqs: int = 1  # an emulated target runs one session at a time: its demand report is 1 of this
    adaptive: bool = False  # choose gamma per round as ``starsd target --adaptive-gamma`` does
    temperature: float = 0.0  # > 0: sampled completions (the draft sends its top-k distributions)

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
    request_bytes: int = 0  # the request and the answer as protobuf payloads
    response_bytes: int = 0


@dataclass
class TargetRun:
    target_id: str
    rounds: list[Round] = field(default_factory=list)
    verify_actual: list[float] = field(default_factory=list)  # seconds held per round (verify + wire)
    sessions: int = 0
    gammas: list[int] = field(default_factory=list)  # drafts asked for, per round
    error: str | None = None


class RoundDraws:
    """How many of a round's drafts a target accepts: position ``y`` while ``u[y] < beta(y)``.

    Every round draws ``len(betas)`` uniforms, however many drafts it was offered, so round ``r`` of a target
    meets the same draws under every gamma policy (common random numbers): a longer gamma accepts the same
    run as a shorter one plus what its extra positions add, and policies differ by their choices, not by luck.
    """

    def __init__(self, betas: Sequence[float], seed: int) -> None:
        self.betas = tuple(betas)
        self._rng = random.Random(seed)

    def __call__(self, offered: int) -> int:
        if offered > len(self.betas):
            raise ValueError(f"{offered} drafts exceed the {len(self.betas)} positions drawn per round")
        draws = [self._rng.random() for _ in self.betas]
        accepted = 0
        while accepted < offered and draws[accepted] < self.betas[accepted]:
            accepted += 1
        return accepted


@dataclass
class _Exchange:
    """The latest request and answer on a target's stream (its rounds are sequential)."""

    sent: float = 0.0
    received: float = 0.0
    service: float = 0.0
    request_bytes: int = 0
    response_bytes: int = 0


class Hold:
    """Holds the calling thread ``seconds`` on average despite late wake-ups (see the module docstring)."""

    def __init__(self) -> None:
        self._late = 0.0  # how much earlier than wanted to wake (learned)

    def __call__(self, seconds: float) -> float:
        """Hold ``seconds``; returns the time actually held."""
        start = time.perf_counter()
        time.sleep(max(0.0, seconds - self._late))
        actual = time.perf_counter() - start
        # Learn the timer's systematic lateness only: a stall of the whole process (another job took the
        # CPU) is clipped, so it shows in the measurements instead of being repaid by short holds later.
        error = min(max(actual - seconds, -_MAX_CORRECTION), _MAX_CORRECTION)
        self._late = min(max(0.0, self._late + 0.2 * error), seconds)
        return actual


class EmulatedTargetRunner:
    """A :class:`starsd.verifier.step_runner.StepRunner` whose step holds for the verify time and draws acceptance
    instead of computing; it commits with the model runner's own rule (:func:`starsd.verifier.runner.commit`).

    A verify row accepts ``accept(drafts)`` of its drafts and adds one token of its own (a random id); a prefill
    row only advances its cache. The step's hold is the same for any number of rows.
    """

    device = torch.device("cpu")  # nothing is computed: a sampled completion's random stream lives here

    def __init__(self, hold_seconds: float, accept: Acceptance, vocab_size: int, seed: int, run: TargetRun) -> None:
        self.hold_seconds = hold_seconds
        self.accept = accept
        self.vocab_size = vocab_size
        self.rng = random.Random(seed ^ 0x5EED)
        self.run = run
        self.exchange = _Exchange()
        self.hold = Hold()

    def new_session(self, prompt: list[int]) -> TargetSession:
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        self.run.sessions += 1
        return TargetSession(committed=list(prompt))

    def release(self, session: TargetSession) -> None:
        session.slot = None

    def step(self, rows: list[StepRow]) -> list[RowOutcome]:
        outcomes = []
        for row in rows:
            if not row.verify:
                outcomes.append(RowOutcome(0, []))
                continue
            accepted = self.accept(len(row.drafts)) if row.drafts else 0
            outcomes.append(RowOutcome(accepted, [*row.drafts[:accepted], self.rng.randrange(self.vocab_size)]))
        held = self.hold(self.hold_seconds)
        committed = time.perf_counter()
        for row, outcome in zip(rows, outcomes, strict=True):
            commit(row, outcome)
            if row.verify and row.drafts:
                ex = self.exchange
                tokens, sizes = len(outcome.tokens), (ex.request_bytes, ex.response_bytes)
                self.run.rounds.append(
                    Round(ex.sent, ex.received, committed, tokens, outcome.accepted, ex.service, *sizes)
                )
                self.run.verify_actual.append(held)
                self.run.gammas.append(len(row.drafts))
        return outcomes


def own_connection(address: str) -> grpc.aio.Channel:
    """A channel with a subchannel pool of its own: each emulated target gets its own TCP connection, like a
    separate node."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


class RecordingDraftClient(DraftClient):
    """The real draft client, on a connection of its own (as a separate node has), noting each exchange's times."""

    def __init__(self, address: str, target_id: str, info: pb.InfoResponse, spec: TargetSpec) -> None:
        options = DraftClientOptions(deadline=spec.timeout, cooldown_rounds=0)
        fingerprint, vocab_size = info.vocab_fingerprint, int(info.vocab_size)
        super().__init__(address, target_id, fingerprint, vocab_size, options, channel=own_connection)
        self.exchange = _Exchange()
        self.wire_seconds = spec.wire_seconds

    def send(self, req: pb.ProposeRequest) -> asyncio.Future[pb.ProposeResponse | None] | None:
        if not req.release:
            # The emulated wire is part of the target's hold: it belongs in the round trip, not the verify time.
            req.rtt_seconds += 2 * self.wire_seconds if req.rtt_seconds else 0.0
            req.verify_seconds = max(0.0, req.verify_seconds - 2 * self.wire_seconds)
        future = super().send(req)
        if future is None or req.release:
            return future
        ex = self.exchange
        ex.sent, ex.request_bytes = time.perf_counter(), req.ByteSize()

        def answered(done: asyncio.Future[pb.ProposeResponse | None]) -> None:
            ex.received = time.perf_counter()
            response = None if done.cancelled() else done.result()
            ex.service = float(response.service_seconds) if response is not None else 0.0
            ex.response_bytes = response.ByteSize() if response is not None else 0

        future.add_done_callback(answered)
        return future


def emulated_model(vocab_size: int) -> LoadedModel:
    """What the engine reads of a loaded model (its vocabulary, no EOS: sessions run to their length)."""
    return LoadedModel(None, None, "emulated", vocab_size, "emulated", 1 << 30, None)


class EmulatedTarget:
    """One target: a real engine and draft link, an emulated runner; completions back to back until stopped."""

    def __init__(
        self,
        target_id: str,
        address: str,
        info: pb.InfoResponse,
        spec: TargetSpec,
        seed: int,
        accept: Acceptance | None = None,
    ) -> None:
        self.target_id = target_id
        self.spec = spec
        self.rng = random.Random(seed)
        self.run_record = TargetRun(target_id)
        self.client = RecordingDraftClient(address, target_id, info, spec)
        self.runner = EmulatedTargetRunner(
            spec.verify_seconds + 2 * spec.wire_seconds,
            accept or RoundDraws(spec.betas, seed),
            spec.vocab_size,
            seed,
            self.run_record,
        )
        self.runner.exchange = self.client.exchange
        batching = BatchOptions(max_num_seqs=spec.max_num_seqs, kv_cache_tokens=1 << 30)
        self.engine = TargetEngine(
            emulated_model(spec.vocab_size),
            self.client,
            gamma=spec.gamma,
            adaptive_gamma=spec.adaptive,
            batching=batching,
            step_runner=self.runner,
        )

    async def connect(self, timeout: float) -> None:
        """Open the stream; RuntimeError if the draft is not reached in ``timeout`` seconds."""
        self.client.start()
        deadline = time.monotonic() + timeout
        while not self.client.connected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.target_id} did not reach the draft: {self.client.last_error or 'timeout'}")
            await asyncio.sleep(0.01)

    async def run(self, stop: asyncio.Event) -> TargetRun:
        """Completions until ``stop`` is set; the round in flight finishes, then its session is released."""
        spec, record = self.spec, self.run_record
        params = SamplingParams(temperature=spec.temperature)
        try:
            while not stop.is_set():
                prompt = [self.rng.randrange(spec.vocab_size) for _ in range(spec.prompt_tokens)]
                stats = GenerationStats()
                # A session ends once it has ``session_tokens`` (checked here, so every round asks for full gamma).
                rounds = self.engine.generate(prompt, spec.session_tokens + spec.gamma + 1, params, stats)
                try:
                    async for _ in rounds:
                        if stats.fallback_tokens:
                            raise RuntimeError(f"a round decoded without the draft ({self.client.last_error})")
                        if stop.is_set() or stats.generated_tokens >= spec.session_tokens:
                            break
                finally:
                    await rounds.aclose()
        except RuntimeError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            await self.close()
        return record

    async def close(self) -> None:
        self.engine.close()
        await self.client.stop()
