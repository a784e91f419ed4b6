"""The draft server's logic, free of gRPC: admit requests, schedule them, compute, answer.

The event loop validates each request and puts it in the global request buffer, which is drained back to back
(work-conserving: a batch goes as soon as the model is free and something waits) by one of two drivers:

* a model in a process of its own (the default, :class:`~starsd.draft.proposers.PipedProposer`) is driven by
  the event loop itself: it sends a batch down the pipe and reads the answers when the pipe is readable, with no
  thread in between (every hand-over between threads is a wake-up on each round's path);
* a model in this process computes on a compute thread, so that the event loop keeps serving meanwhile.

Either way each answer goes to its stream's outgoing queue, so sending never blocks drafting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from starsd import defaults
from starsd import proposal_codec as codec
from starsd.draft.buffer import RequestBuffer
from starsd.draft.load import LoadTracker
from starsd.draft.metrics import DraftMetrics
from starsd.draft.proposers import PipedProposer, ProposalRequest, Proposer, ProposerFailed
from starsd.draft.sessions import Session, SessionError, SessionStore
from starsd.proposals import GREEDY_BELOW, Proposal, SamplingParams
from starsd.proto import starsd_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_TOP_K = defaults.PROPOSAL_TOP_K  # a request that names no top_k
MAX_TOP_K = 64


@dataclass(frozen=True)
class DraftConfig:
    max_gamma: int = defaults.GAMMA_MAX
    max_sessions: int = defaults.DRAFT_MAX_SESSIONS
    idle_timeout: float = defaults.DRAFT_IDLE_TIMEOUT_SECONDS  # seconds without a request before a session is freed
    max_batch: int = 1  # requests drafted together in one step
    schedule: str = defaults.DRAFT_SCHEDULES[0]  # fifo | fair
    load_window: float = 10.0
    gather_seconds: float = 0.003  # the longest a batch waits for the rest of a burst (see starsd.draft.buffer)


@dataclass(eq=False)
class Stream:
    """One target's connection: its outgoing queue is that target's return path."""

    loop: asyncio.AbstractEventLoop
    outgoing: asyncio.Queue[pb.ProposeResponse | None] = field(default_factory=asyncio.Queue)
    target_id: str = ""
    pending: int = 0  # requests queued or computing
    closing: bool = False

    def send(self, response: pb.ProposeResponse) -> None:
        """Answer a request that was never queued (an error found on admission)."""
        self.outgoing.put_nowait(response)

    def answer(self, response: pb.ProposeResponse) -> None:
        """Answer a queued request; the stream ends after the last answer owed once its input has ended."""
        self.pending -= 1
        self.outgoing.put_nowait(response)
        self._end_if_done()

    def input_ended(self, aborted: bool = False) -> None:
        """The target sent its last request (or the stream is aborted: it ends at once, owing nothing)."""
        self.closing = True
        if aborted:
            self.outgoing.put_nowait(None)
        else:
            self._end_if_done()

    def _end_if_done(self) -> None:
        """The end-of-stream rule: the input has ended and nothing is owed."""
        if self.closing and self.pending == 0:
            self.outgoing.put_nowait(None)


@dataclass(eq=False)
class Work:
    stream: Stream
    session: Session
    request: pb.ProposeRequest
    params: SamplingParams
    top_k: int
    enqueued: float


class StreamAborted(Exception):
    """The stream itself is malformed (no target id, or it changed): the whole RPC ends."""


def validate_request(req: pb.ProposeRequest, vocab_size: int, max_gamma: int, max_context: int) -> None:
    """Reject a malformed request with INVALID_ARGUMENT and a message that names the field."""

    def bad(message: str) -> SessionError:
        return SessionError(grpc.StatusCode.INVALID_ARGUMENT, message)

    if req.session_id == 0:
        raise bad("session_id must be > 0")
    if req.seq < 1:
        raise bad("seq must start at 1")
    if req.release:
        return
    if not 1 <= req.gamma <= max_gamma:
        raise bad(f"gamma must be in 1..{max_gamma}, got {req.gamma}")
    if req.seq == 1 and not req.tokens:
        raise bad("the first request of a session (seq 1) must carry its prompt tokens")
    if len(req.tokens) > max_context:
        raise bad(f"{len(req.tokens)} tokens exceed the draft's context of {max_context}")
    bad_ids = [t for t in req.tokens if not 0 <= t < vocab_size]
    if bad_ids:
        raise bad(f"token ids out of range 0..{vocab_size - 1}: {bad_ids[:5]}")
    if req.sample:  # greedy requests draft the argmax: their temperature and top_p are not used
        if not math.isfinite(req.temperature) or req.temperature < GREEDY_BELOW:
            raise bad(f"a sampled request needs a finite temperature >= {GREEDY_BELOW}, got {req.temperature}")
        if not math.isfinite(req.top_p) or not 0 < req.top_p <= 1:
            raise bad(f"top_p must be in (0, 1], got {req.top_p}")
    if req.top_k > MAX_TOP_K:
        raise bad(f"top_k must be at most {MAX_TOP_K}, got {req.top_k}")
    if not math.isfinite(req.occupancy) or req.occupancy < 0:
        raise bad("occupancy must be a finite number >= 0")
    for name in ("verify_seconds", "rtt_seconds"):
        value = getattr(req, name)
        if not math.isfinite(value) or value < 0:
            raise bad(f"{name} must be a finite number >= 0")


def sampling_params(req: pb.ProposeRequest) -> SamplingParams:
    """How to draft for a (validated) request: the target decided greedy or sampled, and says so."""
    if not req.sample:
        return SamplingParams(temperature=0.0)
    return SamplingParams(temperature=req.temperature, top_p=req.top_p)


class DraftCore:
    """Sessions, the request buffer, the compute thread and the load measurements of one draft."""

    def __init__(
        self,
        proposer: Proposer,
        config: DraftConfig,
        metrics: DraftMetrics | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``clock``: seconds, for the queue and service times answers report (tests pass a fake one)."""
        self.proposer = proposer
        self.clock = clock
        self.config = config
        self.metrics = metrics or DraftMetrics()
        self.sessions = SessionStore(config.max_sessions, config.idle_timeout)
        self.buffer: RequestBuffer[Work] = RequestBuffer(config.schedule)
        self.load = LoadTracker(config.load_window)
        self.streams: set[Stream] = set()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.failure: str | None = None  # why the draft cannot compute any more (it must be restarted)
        self.failed = asyncio.Event()  # set on the event loop once ``failure`` is known
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's loop, for answers from the thread
        self._piped: PipedProposer | None = None  # the model's pipe, when the event loop drives it
        self._in_flight: tuple[list[Work], float] | None = None  # the batch on the pipe, and when it was sent
        self._gather_timer: asyncio.TimerHandle | None = None
        self._gathered = False  # the current wait for the rest of a burst has run out

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start computing: on this event loop when the model answers on a pipe, else on a compute thread."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._loop is not None and isinstance(self.proposer, PipedProposer):
            self._piped = self.proposer
            self._loop.add_reader(self._piped.fileno(), self._on_answers)
            return
        self._thread = threading.Thread(target=self._compute_loop, name="draft-compute", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.buffer.close()
        self._stop_reading()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.proposer.close()

    # --- streams (event loop) ------------------------------------------------------------------------

    def open_stream(self, loop: asyncio.AbstractEventLoop) -> Stream:
        stream = Stream(loop=loop)
        self.streams.add(stream)
        self.metrics.targets.set(len(self.streams))
        return stream

    def close_stream(self, stream: Stream) -> None:
        self.streams.discard(stream)
        dropped = self.buffer.discard(lambda work: work.stream is stream)  # nobody is left to answer
        if dropped:
            self.metrics.dropped.inc(dropped)
            self.metrics.queue_depth.set(len(self.buffer))
            log.info("target %r disconnected: dropped its %d queued requests", stream.target_id or "?", dropped)
        freed = self.sessions.release_owner(stream)
        if stream.target_id:
            self.load.forget_target(stream.target_id)
            self.buffer.forget_target(stream.target_id)
        self.metrics.targets.set(len(self.streams))
        self.metrics.sessions.set(len(self.sessions))
        if freed:
            log.info("target %r disconnected: freed %d sessions", stream.target_id or "?", freed)
        self._dispatch()  # a batch that waited for the rest of its burst waits no more

    def submit(self, stream: Stream, req: pb.ProposeRequest) -> None:
        """Admit one request from a stream: queue it for drafting, or answer its error at once."""
        try:
            self._admit(stream, req)
        finally:
            self._dispatch()

    def _admit(self, stream: Stream, req: pb.ProposeRequest) -> None:
        if not req.target_id:
            raise StreamAborted("target_id is required on every message")
        if stream.target_id and req.target_id != stream.target_id:
            raise StreamAborted(f"target_id changed on one stream ({stream.target_id!r} -> {req.target_id!r})")
        stream.target_id = req.target_id
        self.buffer.announce(req.target_id, int(req.following))
        key = (req.target_id, int(req.session_id))
        try:
            info = self.proposer.info
            validate_request(req, info.vocab_size, self.config.max_gamma, info.max_context)
            if req.release:
                if self.sessions.release(key, stream):
                    self.load.forget(key)
                self.metrics.sessions.set(len(self.sessions))
                return
            params = sampling_params(req)
            seed = int(req.seed) if req.HasField("seed") else None
            session = self.sessions.admit(key, int(req.seq), stream, lambda: self.proposer.new_state(seed))
        except SessionError as err:
            self.metrics.errors.labels(code=err.code.name).inc()
            stream.send(_error_response(req, err))
            return
        transfer = None
        if req.rtt_seconds > 0 and session.last_draft_seconds > 0:
            transfer = max(0.0, (req.rtt_seconds - session.last_draft_seconds) / 2)
        self.load.record_request(key, req.verify_seconds, transfer)
        if req.verify_seconds > 0:
            self.metrics.target_verify_seconds.observe(req.verify_seconds)
        if transfer is not None:
            self.metrics.transfer_seconds.observe(transfer)
        self.load.record_demand(req.target_id, req.running_requests, req.waiting_requests, req.occupancy)
        session.busy = True
        stream.pending += 1
        self.metrics.sessions.set(len(self.sessions))
        work = Work(stream, session, req, params, req.top_k or DEFAULT_TOP_K, self.clock())
        self.buffer.put(req.target_id, work)
        self.metrics.queue_depth.set(len(self.buffer))

    def sweep(self) -> int:
        freed = self.sessions.sweep()
        self.metrics.sessions.set(len(self.sessions))
        return freed

    # --- compute driven by the event loop (a model on a pipe) ----------------------------------------

    def _dispatch(self) -> None:
        """Send the next batch if the model is free and a request waits (after holding it up to the gather
        bound for the rest of an announced burst, as :meth:`RequestBuffer.take` does on the compute thread)."""
        if self._piped is None or self._in_flight is not None or self._stopping.is_set() or not len(self.buffer):
            return
        if self._gathering():
            return
        batch = self.buffer.take(self.config.max_batch, timeout=0)
        self._gathered = False
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None
        start = self.clock()
        try:
            self._piped.send_batch([_proposal_request(w) for w in batch])
        except ProposerFailed as exc:
            self._failed_on_loop(exc)
            self._finish(batch, [exc] * len(batch), start, self.clock())
            return
        self._in_flight = (batch, start)

    def _gathering(self) -> bool:
        """Whether the waiting requests hold for more of an announced burst (arming the bound's timer)."""
        config = self.config
        wait = config.gather_seconds > 0 and config.max_batch > 1 and len(self.buffer) < config.max_batch
        if not wait or not self.buffer.announced or self._gathered:
            return False
        if self._gather_timer is None:
            assert self._loop is not None
            self._gather_timer = self._loop.call_later(config.gather_seconds, self._gather_ran_out)
        return True

    def _gather_ran_out(self) -> None:
        self._gather_timer = None
        self._gathered = True
        self._dispatch()

    def _on_answers(self) -> None:
        """The pipe is readable: the batch's answers are there (or the model process is gone)."""
        flight, self._in_flight = self._in_flight, None
        batch, start = flight if flight is not None else ([], self.clock())
        proposals: list[Proposal | Exception]
        try:
            proposals = list(self._piped.receive_batch()) if self._piped is not None else []
        except ProposerFailed as exc:
            self._failed_on_loop(exc)
            proposals = [exc] * len(batch)
        except Exception as exc:  # a failing batch must not stop the draft: answer each request's error
            log.error("drafting failed for a batch of %d: %s", len(batch), exc)
            proposals = [exc] * len(batch)
        if batch:
            self._finish(batch, proposals[: len(batch)], start, self.clock())
        self._dispatch()

    def _failed_on_loop(self, exc: ProposerFailed) -> None:
        log.critical("%s; the draft stops serving so that it is restarted", exc)
        self._stopping.set()
        self._stop_reading()
        self._fail(str(exc))

    def _stop_reading(self) -> None:
        if self._piped is not None and self._loop is not None:
            self._loop.remove_reader(self._piped.fileno())
            self._piped = None
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None

    # --- compute (its own thread) --------------------------------------------------------------------

    def _compute_loop(self) -> None:
        while not self._stopping.is_set():
            batch = self.buffer.take(self.config.max_batch, timeout=0.5, gather=self.config.gather_seconds)
            if batch:
                self._compute(batch)
                if not len(self.buffer):
                    self._draft_ahead()
                continue
            try:
                self.proposer.check()  # idle: a dead model must not wait for the next request to be noticed
            except ProposerFailed as exc:
                self._failed_in_thread(exc, self._loop)

    def _compute(self, batch: list[Work]) -> None:
        start = self.clock()
        requests = [_proposal_request(w) for w in batch]
        try:
            proposals: list[Proposal | Exception] = list(self.proposer.propose_batch(requests))
        except ProposerFailed as exc:  # nothing more can be computed: answer, then stop serving
            self._failed_in_thread(exc, batch[0].stream.loop)
            proposals = [exc] * len(batch)
        except Exception as exc:  # a failing batch must not stop the draft: answer each request's error
            log.exception("drafting failed for a batch of %d", len(batch))
            proposals = [exc] * len(batch)
        end = self.clock()
        # Everything else happens on the event loop, so this thread goes straight to the next request.
        batch[0].stream.loop.call_soon_threadsafe(self._finish, batch, proposals, start, end)

    def _draft_ahead(self) -> None:
        """Idle time after a batch: the proposer drafts ahead until a request waits (or the draft stops)."""
        try:
            self.proposer.draft_ahead(lambda: len(self.buffer) > 0 or self._stopping.is_set())
        except ProposerFailed as exc:
            self._failed_in_thread(exc, self._loop)
        except Exception:  # an optimisation only: the next request drafts from where its session is
            log.exception("drafting ahead failed")

    def _failed_in_thread(self, exc: ProposerFailed, loop: asyncio.AbstractEventLoop | None) -> None:
        log.critical("%s; the draft stops serving so that it is restarted", exc)
        self._stopping.set()
        if loop is not None:
            loop.call_soon_threadsafe(self._fail, str(exc))

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.failed.set()

    def _finish(self, batch: list[Work], proposals: list[Proposal | Exception], start: float, end: float) -> None:
        """Back on the event loop: record the service, build the answers, hand them to their streams."""
        self.load.record_service(start, end, len(batch))
        self.metrics.busy_seconds.inc(end - start)
        self.metrics.batch_size.observe(len(batch))
        per_request = (end - start) / len(batch)
        for work, proposal in zip(batch, proposals, strict=True):
            if isinstance(proposal, Exception):
                code = grpc.StatusCode.UNAVAILABLE if isinstance(proposal, ProposerFailed) else grpc.StatusCode.INTERNAL
                err = SessionError(code, f"drafting failed: {proposal}")
                response = _error_response(work.request, err)
            else:
                response = _proposal_response(work.request, proposal, per_request)
                response.draft_sessions = len(self.sessions)
                response.queue_seconds = max(0.0, start - work.enqueued)
                self.metrics.draft_tokens.inc(len(proposal.token_ids))
                if proposal.ahead:
                    self.metrics.ahead_hits.inc()
                    self.metrics.ahead_tokens.inc(proposal.ahead)
            self.metrics.requests.inc()
            self.metrics.service_seconds.observe(per_request)
            work.session.last_draft_seconds = end - work.enqueued
            work.session.busy = False
            work.stream.answer(response)
        self.metrics.queue_depth.set(len(self.buffer))


def _proposal_request(work: Work) -> ProposalRequest:
    req = work.request
    return ProposalRequest(work.session.state, list(req.tokens), int(req.gamma), work.params, work.top_k)


def _error_response(req: pb.ProposeRequest, err: SessionError) -> pb.ProposeResponse:
    return pb.ProposeResponse(
        target_id=req.target_id,
        session_id=req.session_id,
        seq=req.seq,
        error_code=err.code.value[0],
        error_message=err.message,
    )


def _proposal_response(req: pb.ProposeRequest, proposal: Proposal, service: float) -> pb.ProposeResponse:
    header = pb.ProposeResponse(
        target_id=req.target_id, session_id=req.session_id, seq=req.seq, service_seconds=service
    )
    return codec.encode(proposal, header)
