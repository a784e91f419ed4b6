"""The target's side of the star: one long-lived stream to the draft, with reconnection and deadlines.

The client never makes a completion wait for the draft longer than its deadline: when the draft is down,
slow, or answers with an error, :meth:`DraftLink.propose` returns ``None`` and the caller decodes the round
on its own (a fallback token). A reconnect loop with capped exponential backoff brings the draft back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from starsd import defaults
from starsd.adaptive import AcceptanceEstimate, choose_gamma, ewma
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from starsd.sampling import SamplingParams
from starsd.verifier.discovery import DraftDiscovery
from starsd.verifier.draft_pool import PROBE_SECONDS, DraftPolicy, Reason, has_room

log = logging.getLogger(__name__)


class VocabularyMismatch(RuntimeError):
    """The draft serves another vocabulary: its proposals would be meaningless to this target."""


@dataclass(frozen=True)
class Demand:
    """What this target reports to the draft on every request (the operator's demand signal)."""

    running: int = 0  # completions in the batch
    waiting: int = 0  # completions waiting for a batch slot
    occupancy: float = 0.0  # running / max-num-seqs


@dataclass(frozen=True)
class DraftClientOptions:
    deadline: float = defaults.DRAFT_TIMEOUT_SECONDS  # seconds a round waits for the draft before decoding alone
    connect_timeout: float = 5.0
    backoff_initial: float = 0.1
    backoff_max: float = 2.0
    cooldown_rounds: int = 8  # rounds decoded alone after a missed deadline before asking again
    top_k: int = defaults.PROPOSAL_TOP_K  # support of sampled proposals
    tls_ca: Path | None = None  # PEM CA bundle: talk TLS to the draft
    probe_interval: float = PROBE_SECONDS  # seconds between probes of the first-choice draft while away from it


def check_draft_info(info: pb.InfoResponse, fingerprint: str, vocab_size: int) -> None:
    if info.vocab_fingerprint != fingerprint or info.vocab_size != vocab_size:
        raise VocabularyMismatch(
            f"the draft model {info.model_name!r} does not share this target's vocabulary "
            f"(draft: {info.vocab_size} ids, fingerprint {info.vocab_fingerprint}; "
            f"target: {vocab_size} ids, fingerprint {fingerprint}); use a draft trained with the same tokenizer"
        )


_MOVE_WHY = {
    Reason.DRAFT_LOST: "the draft was lost",
    Reason.FIRST_CHOICE_BACK: "the first choice is back and has room",
    Reason.DRAFTS_CHANGED: "the drafts found changed",
}


class NoRoom(RuntimeError):
    """The first-choice draft answered a probe but reports no room for another target."""


@dataclass
class _Stream:
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


class DraftClient:
    """The target's link to its drafts: one stream to one draft at a time, chosen by a :class:`DraftPolicy`.

    ``address`` is one ``HOST:PORT`` or this target's ordered list of them (first choice first, see
    :func:`starsd.assignment.ordered_drafts`). With ``discovery`` the drafts are found live instead
    (:mod:`starsd.verifier.discovery`: ``address`` is then ignored and the order is the discovery's, kept up to
    date while the client runs). When the draft in use is gone the client moves to the next that answers; while
    away from its first choice it probes it and moves back when it has room; when the drafts found change, it
    moves to a new first choice or off a draft no longer listed (docs/architecture.md, "Several drafts"). Every
    move opens a new stream and bumps :attr:`generation`, so sessions start afresh there.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        target_id: str,
        fingerprint: str,
        vocab_size: int,
        options: DraftClientOptions,
        *,
        discovery: DraftDiscovery | None = None,
    ) -> None:
        self.discovery = discovery
        if discovery is not None:
            order = discovery.order
            self.policy = DraftPolicy(order, options.probe_interval, live=True)
        else:
            order = (address,) if isinstance(address, str) else tuple(address)
            self.policy = DraftPolicy(order, options.probe_interval)
        # the draft in use, or the one last used or tried (the discovery's name before any is found)
        self.address = order[0] if order else str(discovery.source if discovery else "")
        self.target_id = target_id
        self.fingerprint = fingerprint
        self.vocab_size = vocab_size
        self.options = options
        # Read once here (a bad path fails at start, not at some later reconnect outside any handler).
        self._root_certificates = options.tls_ca.read_bytes() if options.tls_ca else None
        self.connected = False
        self.generation = 0  # bumped on every new stream: sessions of an older one are gone on the draft
        self.last_error = ""
        self.incompatible = False  # no draft shares the vocabulary: retrying cannot help until one changes
        self._stream: _Stream | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._discovering: asyncio.Task[None] | None = None
        self._drafts_changed = asyncio.Event()
        self._session_ids = itertools.count(int.from_bytes(os.urandom(4), "big") << 20 | 1)
        self.demand: Callable[[], Demand] = Demand  # the engine sets its own reader
        self.on_switch: Callable[[Reason], None] = lambda reason: None  # the engine counts moves in its metrics

    @property
    def addresses(self) -> tuple[str, ...]:
        """This target's drafts, first choice first."""
        return self.policy.order

    @property
    def rank(self) -> int | None:
        """The position of the draft in use in :attr:`addresses` (0: the first choice); None when none is (or
        when the draft in use is no longer listed, until the client moves off it)."""
        return self.policy.rank if self._stream is not None and self.connected else None

    @property
    def drafts_from(self) -> str:
        """Where the drafts are found (``dns:HOST:PORT``); "" for a static list."""
        return str(self.discovery.source) if self.discovery is not None else ""

    @property
    def discovery_error(self) -> str:
        """Why the last lookup of the drafts failed ("" when it succeeded, or for a static list)."""
        return self.discovery.error if self.discovery is not None else ""

    def _channel(self) -> grpc.aio.Channel:
        """A channel to :attr:`address` (a subclass may open its own kind)."""
        return self._channel_to(self.address)

    def _channel_to(self, address: str) -> grpc.aio.Channel:
        options = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]
        if self._root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
            return grpc.aio.secure_channel(address, creds, options=options)
        return grpc.aio.insecure_channel(address, options=options)

    def _open_channel(self, address: str) -> grpc.aio.Channel:
        return self._channel() if address == self.address else self._channel_to(address)

    async def fetch_info(self, timeout: float, address: str | None = None) -> pb.InfoResponse:
        """The Info answer of ``address`` (default: :attr:`address`)."""
        async with self._open_channel(address or self.address) as channel:
            info: pb.InfoResponse = await pb_grpc.DraftStub(channel).Info(pb.InfoRequest(), timeout=timeout)
            return info

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="draft-client")
        if self.discovery is not None:
            self._discovering = asyncio.create_task(
                self.discovery.run(lambda order: self._drafts_changed.set()), name="draft-discovery"
            )

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._discovering, *self._retiring) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def new_session_id(self) -> int:
        return next(self._session_ids)

    # --- the connection loop -------------------------------------------------------------------------

    def _take_drafts(self) -> None:
        """Follow the drafts found since the last look (a no-op for a static list)."""
        if self.discovery is None or not self._drafts_changed.is_set():
            return
        self._drafts_changed.clear()
        self.policy.reorder(self.discovery.order, time.monotonic())

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the drafts found change."""
        if self.discovery is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drafts_changed.wait(), seconds)

    async def _open(self, rank: int, need_room: bool = False) -> _Stream:
        """A new stream to draft ``rank``, after its vocabulary check (and, when moving back, its room check).
        Raises grpc.aio.AioRpcError, VocabularyMismatch or NoRoom."""
        address = self.policy.order[rank]
        channel = self._open_channel(address)
        try:
            stub = pb_grpc.DraftStub(channel)
            info = await stub.Info(pb.InfoRequest(), timeout=self.options.connect_timeout)
            check_draft_info(info, self.fingerprint, self.vocab_size)
            if need_room and not has_room(info):
                raise NoRoom(
                    f"the draft at {address} has no room (utilization {info.utilization:.2f}, "
                    f"{info.sessions} of {info.max_sessions} sessions)"
                )
            queue: asyncio.Queue[pb.ProposeRequest | None] = asyncio.Queue()
            call = stub.Propose(self._requests(queue))
            return _Stream(rank, address, info.model_name, channel, queue, call)
        except BaseException:
            await channel.close(grace=None)
            raise

    async def _connect(self) -> _Stream | None:
        """Try the drafts the policy lists, in order; the first that answers with the same vocabulary."""
        mismatched = tried = 0
        for rank in self.policy.attempts():
            tried += 1
            try:
                return await self._open(rank)
            except VocabularyMismatch as exc:
                mismatched += 1
                self.last_error = str(exc)
                log.error("skipping the draft at %s: %s", self.policy.order[rank], exc)
            except grpc.aio.AioRpcError as exc:
                self.last_error = f"{self.policy.order[rank]}: {exc.code().name}: {exc.details()}"
        if not tried:
            self.last_error = f"no draft found at {self.drafts_from}" + (
                f": {self.discovery_error}" if self.discovery_error else ""
            )
        self.incompatible = tried > 0 and mismatched == tried
        return None

    def _use(self, stream: _Stream) -> None:
        """Send every request on ``stream`` from now on (sessions start afresh there: a new generation)."""
        previous = self.policy.describe(self.policy.last)
        reason = self.policy.connected(stream.rank, time.monotonic())
        self._stream = stream
        self.address = stream.address
        self.generation += 1
        self.connected = True
        self.incompatible = False
        self.last_error = ""
        if reason is None:
            log.info("connected to the draft %r at %s", stream.model_name, self.policy.describe(stream.rank))
            return
        log.warning(
            "moved from the draft at %s to the draft at %s: %s",
            previous,
            self.policy.describe(stream.rank),
            _MOVE_WHY[reason],
        )
        self.on_switch(reason)

    async def _run(self) -> None:
        backoff = self.options.backoff_initial
        while True:
            self._take_drafts()
            stream = await self._connect()
            if stream is None:
                if self.incompatible and len(self.policy.order) > 1:  # each draft's reason is logged already
                    log.error("none of the %d drafts shares this target's vocabulary", len(self.policy.order))
                quiet = self.incompatible or not self.policy.order  # retrying soon cannot help
                await self._pause(self.options.backoff_max if quiet else backoff)
                backoff = min(self.options.backoff_max, backoff * 2)
                continue
            backoff = self.options.backoff_initial
            self._use(stream)
            await self._serve()
            log.warning("lost the draft at %s (%s); decoding alone, reconnecting", self.address, self.last_error)
            await asyncio.sleep(backoff)
            backoff = min(self.options.backoff_max, backoff * 2)

    async def _serve(self) -> None:
        """Read the stream in use until it ends; meanwhile probe the first choice and move back to it."""
        assert self._stream is not None
        reader = asyncio.create_task(self._read(self._stream), name="draft-stream")
        probe: asyncio.Task[_Stream | None] | None = None
        try:
            while True:
                self._take_drafts()
                delay = self.policy.probe_delay(time.monotonic())
                changed = asyncio.create_task(self._drafts_changed.wait()) if self.discovery is not None else None
                try:
                    waiting = {reader} if changed is None else {reader, changed}
                    done, _ = await asyncio.wait(waiting, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if changed is not None and not changed.done():
                        changed.cancel()
                if reader in done:
                    self.last_error = reader.result()
                    self.connected = False
                    self.policy.lost()
                    return
                if changed is not None and changed in done:
                    continue  # follow the new drafts first (the next pass reorders, then probes if need be)
                # The probe runs beside the reader: a probe that hangs (a first choice cut off by the network)
                # must not hold back the failover of a stream that breaks meanwhile.
                move = self._escape() if self.policy.displaced is not None else self._probe()
                probe = asyncio.create_task(move, name="draft-probe")
                await asyncio.wait({reader, probe}, return_when=asyncio.FIRST_COMPLETED)
                if not probe.done():
                    probe.cancel()
                    await asyncio.wait({probe})
                better = None if probe.cancelled() else probe.result()
                if better is not None and not reader.done():
                    old, old_reader = self._stream, reader
                    self._use(better)
                    reader = asyncio.create_task(self._read(better), name="draft-stream")
                    self._retire(old, old_reader)
                elif better is not None:  # the stream in use ended meanwhile: the next loop notices
                    self._retire(better, None)
        finally:
            if probe is not None and not probe.done():
                probe.cancel()
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            if self._stream is not None:
                self._stream.queue.put_nowait(None)
                self._stream.fail_pending()
                await self._stream.channel.close(grace=None)
            self.connected = False

    async def _escape(self) -> _Stream | None:
        """The draft in use left the drafts found: a new stream to the best listed draft that answers (the old
        stream keeps serving meanwhile, and until one does)."""
        for rank in self.policy.attempts():
            try:
                stream = await self._open(rank)
            except (grpc.aio.AioRpcError, VocabularyMismatch) as exc:
                log.info("cannot move to the draft at %s: %s", self.policy.order[rank], exc)
                continue
            self.policy.escaped(time.monotonic(), found=True)
            return stream
        self.policy.escaped(time.monotonic(), found=False)
        return None

    async def _probe(self) -> _Stream | None:
        """Ask the first choice whether it is back with room; a new stream to it if so."""
        try:
            stream = await self._open(0, need_room=True)
        except (grpc.aio.AioRpcError, VocabularyMismatch, NoRoom) as exc:
            self.policy.probed(time.monotonic(), answered=isinstance(exc, NoRoom), room=False)
            if not isinstance(exc, grpc.aio.AioRpcError):
                log.info("staying on the draft at %s: %s", self.address, exc)
            return None
        if self.policy.probed(time.monotonic(), answered=True, room=True):
            return stream
        self._retire(stream, None)
        return None

    def _retire(self, stream: _Stream, reader: asyncio.Task[str] | None) -> None:
        """Close a stream no longer used, after it answered what it owes (so no round in flight is lost)."""

        async def retire() -> None:
            stream.queue.put_nowait(None)  # half-close: the draft answers what it holds, then ends the stream
            try:
                if reader is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(reader), self.options.deadline + 1.0)
            finally:
                if reader is not None and not reader.done():
                    reader.cancel()
                stream.fail_pending()
                await stream.channel.close(grace=None)

        task = asyncio.create_task(retire(), name="draft-stream-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _read(self, stream: _Stream) -> str:
        """Deliver the stream's answers to their rounds; returns why the stream ended."""
        try:
            async for response in stream.call:
                future = stream.pending.pop((response.session_id, response.seq), None)
                if future is not None and not future.done():
                    future.set_result(response)
            return "the draft closed the stream"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # the connection loop must outlive any stream
            log.exception("the stream to the draft at %s failed", stream.address)
            return f"{type(exc).__name__}: {exc}"
        finally:
            stream.fail_pending()

    @staticmethod
    async def _requests(queue: asyncio.Queue[pb.ProposeRequest | None]) -> AsyncIterator[pb.ProposeRequest]:
        while True:
            req = await queue.get()
            if req is None:
                return
            req.following = queue.qsize()  # the rest of this burst, already queued (see the proto)
            yield req

    def send(self, req: pb.ProposeRequest) -> asyncio.Future[pb.ProposeResponse | None] | None:
        """Queue a request on the live stream; the future resolves with its answer (None if the stream dies)."""
        stream = self._stream
        if not self.connected or stream is None:
            return None
        future: asyncio.Future[pb.ProposeResponse | None] = asyncio.get_running_loop().create_future()
        if req.release:
            future.set_result(None)
        else:
            stream.pending[(req.session_id, req.seq)] = future
        stream.queue.put_nowait(req)
        return future

    def forget(self, session_id: int, seq: int) -> None:
        if self._stream is not None:
            self._stream.pending.pop((session_id, seq), None)


def proposal_fault(response: pb.ProposeResponse, gamma: int, vocab_size: int, sampled: bool) -> str | None:
    """What is wrong with a draft's answer, or None if it can be verified (a faulty one is decoded alone)."""
    ids = list(response.token_ids)
    if len(ids) > gamma:
        return f"{len(ids)} tokens proposed, {gamma} asked for"
    if any(not 0 <= t < vocab_size for t in ids):
        return f"a proposed token id is outside 0..{vocab_size - 1}"
    if not sampled or not ids:
        return None
    k = response.top_k
    if k < 1 or len(response.q_ids) != k * len(ids) or len(response.q_probs) != k * len(ids):
        return f"a sampled proposal needs top_k >= 1 and top_k entries per token (top_k {k}, {len(ids)} tokens)"
    for i, d in enumerate(ids):
        support = response.q_ids[i * k : (i + 1) * k]
        probs = response.q_probs[i * k : (i + 1) * k]
        if any(not (math.isfinite(q) and q >= 0.0) for q in probs) or abs(sum(probs) - 1.0) > 1e-3:
            return f"the proposal distribution at position {i + 1} is not a probability distribution"
        real = [t for t in support if t >= 0]
        if any(t >= vocab_size for t in real) or len(set(real)) != len(real):
            return f"the support at position {i + 1} holds an id outside the vocabulary or twice"
        if any(t < 0 and q != 0.0 for t, q in zip(support, probs, strict=True)):
            return f"padding at position {i + 1} carries probability"
        if not any(t == d and q > 0.0 for t, q in zip(support, probs, strict=True)):
            return f"token {d} at position {i + 1} has no probability in the distribution it was drawn from"
    return None


@dataclass
class DraftProposal:
    token_ids: list[int]
    q_ids: list[list[int]]  # per position, the support of the distribution it was drawn from (sampled only)
    q_probs: list[list[float]]


class DraftLink:
    """One completion's session on the draft: what it has told the draft, and its sequence numbers."""

    def __init__(self, client: DraftClient, params: SamplingParams, seed: int) -> None:
        self.client = client
        self.params = params
        self.seed = seed
        self.session_id = 0
        self.seq = 0
        self.synced = 0  # committed tokens the draft already knows
        self.generation = -1
        self.cooldown = 0
        self.malformed = False  # the last answer failed validation (the caller counts it, then clears this)
        self.rtt = 0.0
        # What adaptive gamma needs: this session's acceptance and the draft's measured costs.
        self.acceptance = AcceptanceEstimate()
        self.token_time = 0.0  # draft seconds per proposed token
        self.transfer_time = float("nan")  # one-way transfer and protocol overhead (mean, queueing excluded)
        self.draft_sessions = 1

    def _reset(self) -> None:
        self.session_id, self.seq, self.synced = 0, 0, 0

    async def propose(self, committed: list[int], gamma: int, verify_seconds: float) -> DraftProposal | None:
        client = self.client
        if self.cooldown > 0:
            self.cooldown -= 1
            return None
        if not client.connected:
            return None
        if self.generation != client.generation:  # a new stream: the draft lost this session
            self._reset()
            self.generation = client.generation
        if self.session_id == 0:
            self.session_id = client.new_session_id()
        self.seq += 1
        req = pb.ProposeRequest(
            target_id=client.target_id,
            session_id=self.session_id,
            seq=self.seq,
            tokens=committed[self.synced :],
            gamma=gamma,
            sample=not self.params.greedy,
            temperature=0.0 if self.params.greedy else self.params.temperature,
            top_p=self.params.top_p,
            top_k=client.options.top_k,
            seed=self.seed,
            verify_seconds=verify_seconds,
            rtt_seconds=self.rtt,
        )
        demand = client.demand()
        req.running_requests, req.waiting_requests, req.occupancy = demand.running, demand.waiting, demand.occupancy
        sent = time.perf_counter()
        future = client.send(req)
        if future is None:
            return None
        try:
            response = await asyncio.wait_for(future, client.options.deadline)
        except TimeoutError:
            # The draft may yet process this request: its view of the session is unknown, so drop the session.
            client.forget(self.session_id, self.seq)
            self.release()
            self.cooldown = client.options.cooldown_rounds
            return None
        if response is None:
            self._reset()
            return None
        self.rtt = time.perf_counter() - sent
        if response.error_code:
            log.warning("draft refused session %d seq %d: %s", self.session_id, self.seq, response.error_message)
            self.release()
            return None
        fault = proposal_fault(response, gamma, client.vocab_size, sampled=not self.params.greedy)
        if fault is not None:
            log.warning("malformed draft answer for session %d seq %d: %s", self.session_id, self.seq, fault)
            self.malformed = True
            self.release()
            return None
        self.synced = len(committed)
        if response.token_ids:
            self.token_time = response.service_seconds / len(response.token_ids)
        self.transfer_time = ewma(
            self.transfer_time, max(0.0, (self.rtt - response.service_seconds - response.queue_seconds) / 2)
        )
        self.draft_sessions = max(1, response.draft_sessions)
        k = response.top_k
        q_ids = [list(response.q_ids[i * k : (i + 1) * k]) for i in range(len(response.token_ids))] if k else []
        q_probs = [list(response.q_probs[i * k : (i + 1) * k]) for i in range(len(response.token_ids))] if k else []
        return DraftProposal(list(response.token_ids), q_ids, q_probs)

    def next_gamma(self, max_gamma: int, verify_seconds: float) -> int:
        """Adaptive gamma for the next round, from this session's measurements (see starsd.adaptive)."""
        tc = 0.0 if math.isnan(self.transfer_time) else self.transfer_time
        return choose_gamma(self.acceptance.alpha, self.token_time, verify_seconds, tc, self.draft_sessions, max_gamma)

    def release(self) -> None:
        """Free this session on the draft (fire and forget) and start afresh next time."""
        if self.session_id and self.generation == self.client.generation:
            self.client.send(
                pb.ProposeRequest(
                    target_id=self.client.target_id,
                    session_id=self.session_id,
                    seq=self.seq + 1,
                    release=True,
                )
            )
        self._reset()
