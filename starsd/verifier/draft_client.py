"""The target's side of the star: one long-lived stream to a draft, chosen among several, with reconnection.

The client never makes a completion wait for the draft longer than its deadline: when the draft is down,
slow, or answers with an error, :meth:`starsd.verifier.draft_link.DraftLink.propose` returns ``None`` and the
caller decodes the round on its own (a fallback token). A reconnect loop with capped exponential backoff brings
the draft back; the stream itself is :class:`starsd.verifier.draft_stream.DraftStream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from starsd import defaults
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from starsd.verifier.discovery import DraftDiscovery
from starsd.verifier.draft_pool import PROBE_SECONDS, DraftPolicy, Reason
from starsd.verifier.draft_stream import (
    ChannelFactory,
    DraftStream,
    NoRoom,
    VocabularyMismatch,
    channel_factory,
    check_draft_info,
    open_stream,
)

# The client's whole interface; the vocabulary check is the stream's (draft_stream.py), named here for callers.
__all__ = ["Demand", "DraftClient", "DraftClientOptions", "VocabularyMismatch", "check_draft_info"]

log = logging.getLogger(__name__)


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


_MOVE_WHY = {
    Reason.DRAFT_LOST: "the draft was lost",
    Reason.FIRST_CHOICE_BACK: "the first choice is back and has room",
    Reason.DRAFTS_CHANGED: "the drafts found changed",
}


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
        channel: ChannelFactory | None = None,
    ) -> None:
        """``channel`` opens the channel to a draft's address (default: keepalive, TLS with ``options.tls_ca``)."""
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
        self._new_channel = channel or channel_factory(options.tls_ca.read_bytes() if options.tls_ca else None)
        self.connected = False
        self.generation = 0  # bumped on every new stream: sessions of an older one are gone on the draft
        self.last_error = ""
        self.incompatible = False  # no draft shares the vocabulary: retrying cannot help until one changes
        self._stream: DraftStream | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._discovering: asyncio.Task[None] | None = None
        self._drafts_changed = asyncio.Event()
        self._session_ids = itertools.count(int.from_bytes(os.urandom(4), "big") << 20 | 1)
        self.demand: Callable[[], Demand] = Demand  # the engine sets its own reader
        self.on_switch: Callable[[Reason], None] = lambda reason: None  # the engine counts moves in its metrics
        self.on_malformed: Callable[[], None] = lambda: None  # an answer failed validation (the engine counts it)

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

    async def fetch_info(self, timeout: float, address: str | None = None) -> pb.InfoResponse:
        """The Info answer of ``address`` (default: :attr:`address`)."""
        async with self._new_channel(address or self.address) as channel:
            info: pb.InfoResponse = await pb_grpc.DraftStub(channel).Info(pb.InfoRequest(), timeout=timeout)
            return info

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="draft-client")
        if self.discovery is not None:
            self._discovering = asyncio.create_task(
                self.discovery.run(lambda order: self._drafts_changed.set()), name="draft-discovery"
            )

    async def stop(self) -> None:
        """Cancel the client's tasks and wait until they have ended. Their cancellation is not raised; a
        cancellation of the caller is (it is not mistaken for theirs), and a task that had failed is logged."""
        tasks = {t for t in (self._task, self._discovering, *self._retiring) if t is not None}
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                log.warning("the draft client's task %s had failed: %r", task.get_name(), task.exception())

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
            async with asyncio.timeout(seconds):
                await self._drafts_changed.wait()

    async def _open(self, rank: int, need_room: bool = False) -> DraftStream:
        """A new stream to draft ``rank`` (see :func:`starsd.verifier.draft_stream.open_stream`)."""
        address = self.policy.order[rank]
        channel, timeout = self._new_channel(address), self.options.connect_timeout
        return await open_stream(channel, rank, address, self.fingerprint, self.vocab_size, timeout, need_room)

    async def _connect(self) -> DraftStream | None:
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

    def _use(self, stream: DraftStream) -> None:
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
        reader = asyncio.create_task(self._stream.read(), name="draft-stream")
        probe: asyncio.Task[DraftStream | None] | None = None
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
                    reader = asyncio.create_task(better.read(), name="draft-stream")
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
                await self._stream.close()
            self.connected = False

    async def _escape(self) -> DraftStream | None:
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

    async def _probe(self) -> DraftStream | None:
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

    def _retire(self, stream: DraftStream, reader: asyncio.Task[str] | None) -> None:
        """Close a stream no longer used, after it answered what it owes (so no round in flight is lost)."""

        async def retire() -> None:
            stream.queue.put_nowait(None)  # half-close: the draft answers what it holds, then ends the stream
            try:
                if reader is not None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.options.deadline + 1.0):
                            await asyncio.shield(reader)
            finally:
                if reader is not None and not reader.done():
                    reader.cancel()
                stream.fail_pending()
                await stream.channel.close(grace=None)

        task = asyncio.create_task(retire(), name="draft-stream-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def send(self, req: pb.ProposeRequest) -> asyncio.Future[pb.ProposeResponse | None] | None:
        """Queue a request on the live stream; the future resolves with its answer (None if the stream dies)."""
        stream = self._stream
        if not self.connected or stream is None:
            return None
        return stream.put(req)

    def forget(self, session_id: int, seq: int) -> None:
        if self._stream is not None:
            self._stream.pending.pop((session_id, seq), None)
