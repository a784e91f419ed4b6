"""The draft's logic without gRPC: sessions, the request buffer, validation, load, batch curves."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from starsd.draft.buffer import RequestBuffer
from starsd.draft.core import validate_request
from starsd.draft.load import LoadTracker
from starsd.draft.proposers import curve_time
from starsd.draft.sessions import SessionError, SessionStore
from starsd.proto import starsd_pb2 as pb
from starsd.system_model import BatchCurve


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sessions_open_at_seq_1_and_advance_in_order() -> None:
    store = SessionStore(max_sessions=4, idle_timeout=10)
    owner = object()
    s = store.admit(("t", 1), 1, owner, lambda: "state")
    assert s.state == "state" and s.next_seq == 2
    assert store.admit(("t", 1), 2, owner, lambda: None) is s


@pytest.mark.parametrize(
    ("seq", "code"),
    [(1, grpc.StatusCode.INVALID_ARGUMENT), (3, grpc.StatusCode.INVALID_ARGUMENT)],
)
def test_repeated_or_skipped_sequence_numbers_are_invalid(seq: int, code: grpc.StatusCode) -> None:
    store = SessionStore(max_sessions=4, idle_timeout=10)
    owner = object()
    store.admit(("t", 1), 1, owner, lambda: None)
    with pytest.raises(SessionError) as info:
        store.admit(("t", 1), seq, owner, lambda: None)
    assert info.value.code == code


def test_unknown_session_is_not_found_and_full_store_is_exhausted() -> None:
    store = SessionStore(max_sessions=1, idle_timeout=10)
    owner = object()
    with pytest.raises(SessionError) as info:
        store.admit(("t", 9), 2, owner, lambda: None)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    store.admit(("t", 1), 1, owner, lambda: None)
    with pytest.raises(SessionError) as info:
        store.admit(("t", 2), 1, owner, lambda: None)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_sessions_are_isolated_per_stream_and_freed_with_it() -> None:
    store = SessionStore(max_sessions=8, idle_timeout=10)
    a, b = object(), object()
    store.admit(("t", 1), 1, a, lambda: None)
    store.admit(("t", 2), 1, a, lambda: None)
    store.admit(("u", 1), 1, b, lambda: None)
    with pytest.raises(SessionError):
        store.admit(("t", 1), 2, b, lambda: None)  # another stream cannot drive this session
    assert store.release_owner(a) == 2
    assert len(store) == 1 and ("u", 1) in store


def test_idle_sessions_are_swept_but_busy_ones_kept() -> None:
    clock = Clock()
    store = SessionStore(max_sessions=8, idle_timeout=10, clock=clock)
    owner = object()
    idle = store.admit(("t", 1), 1, owner, lambda: None)
    busy = store.admit(("t", 2), 1, owner, lambda: None)
    busy.busy = True
    clock.now += 11
    assert store.sweep() == 1
    assert ("t", 2) in store and ("t", 1) not in store
    assert idle.key == ("t", 1)


def test_fifo_buffer_keeps_arrival_order_and_batches() -> None:
    buf: RequestBuffer[str] = RequestBuffer("fifo")
    for i, target in enumerate(["a", "a", "b", "a"]):
        buf.put(target, f"{target}{i}")
    assert buf.take(3) == ["a0", "a1", "b2"]
    assert buf.take(3) == ["a3"]


def test_fair_buffer_round_robins_over_targets() -> None:
    buf: RequestBuffer[str] = RequestBuffer("fair")
    for i in range(6):
        buf.put("busy", f"busy{i}")
    buf.put("quiet", "quiet0")
    buf.put("other", "other0")
    assert buf.take(5) == ["busy0", "quiet0", "other0", "busy1", "busy2"]


def test_fair_buffer_honours_weights() -> None:
    buf: RequestBuffer[str] = RequestBuffer("fair", weights={"big": 2})
    for i in range(4):
        buf.put("big", f"big{i}")
        buf.put("small", f"small{i}")
    assert buf.take(6) == ["big0", "big1", "small0", "big2", "big3", "small1"]


def test_take_blocks_until_an_item_arrives() -> None:
    buf: RequestBuffer[int] = RequestBuffer()
    threading.Timer(0.05, lambda: buf.put("t", 1)).start()
    assert buf.take(4, timeout=5) == [1]
    assert buf.take(4, timeout=0.01) == []


def _arrive_later(buf: RequestBuffer[int], target: str, items: list[int], delay: float) -> None:
    """The rest of a burst: each arrives ``delay`` apart, announcing how many of it still follow."""

    def send() -> None:
        for i, item in enumerate(items):
            time.sleep(delay)
            buf.announce(target, len(items) - 1 - i)
            buf.put(target, item)

    threading.Thread(target=send, daemon=True).start()


def test_a_batch_waits_for_the_rest_of_an_announced_burst() -> None:
    """The first request of a burst says three more follow: the batch holds for them instead of leaving alone."""
    buf: RequestBuffer[int] = RequestBuffer()
    buf.announce("t", 3)
    buf.put("t", 0)
    _arrive_later(buf, "t", [1, 2, 3], delay=0.01)
    started = time.monotonic()
    assert buf.take(8, timeout=5, gather=30.0) == [0, 1, 2, 3]
    assert time.monotonic() - started < 30.0  # it went as soon as the burst was in, not at the bound
    assert buf.announced == 0


def _take_in_thread(buf: RequestBuffer[int], **kw: float) -> list[int]:
    """``buf.take(8, **kw)`` on another thread; fails if it has not returned within a minute (a take that waits
    for its gathering bound of an hour instead of going at once)."""
    out: list[list[int]] = []
    worker = threading.Thread(target=lambda: out.append(buf.take(8, **kw)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert out, "the batch waited for requests that nobody announced"
    return out[0]


def test_without_an_announcement_or_with_gather_off_a_batch_goes_at_once() -> None:
    buf: RequestBuffer[int] = RequestBuffer()
    buf.put("t", 0)
    assert _take_in_thread(buf, timeout=5, gather=3600.0) == [0]  # nothing announced
    buf.put("t", 1)
    assert buf.take(8, timeout=5) == [1]
    buf.announce("t", 1)
    buf.put("t", 2)
    assert _take_in_thread(buf, timeout=5, gather=0.0) == [2]  # announced, but this draft does not gather


def test_gathering_stops_at_its_bound_and_when_the_target_is_gone() -> None:
    buf: RequestBuffer[int] = RequestBuffer()
    buf.announce("t", 5)  # five announced, none ever comes
    buf.put("t", 0)
    assert buf.take(8, timeout=5, gather=0.05) == [0]
    buf.put("t", 1)
    threading.Timer(0.05, lambda: buf.forget_target("t")).start()
    assert buf.take(8, timeout=5, gather=30.0) == [1]
    assert buf.announced == 0


def test_a_full_batch_does_not_wait_for_announced_requests() -> None:
    buf: RequestBuffer[int] = RequestBuffer()
    for i in range(4):
        buf.announce("t", 10 - i)
        buf.put("t", i)
    assert buf.take(4, timeout=5, gather=30.0) == [0, 1, 2, 3]


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="fifo, fair"):
        RequestBuffer("lifo")


def _req(**kw) -> pb.ProposeRequest:
    base = dict(target_id="t", session_id=1, seq=1, tokens=[1, 2], gamma=4, top_p=1.0)
    base.update(kw)
    return pb.ProposeRequest(**base)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(session_id=0), "session_id"),
        (dict(seq=0), "seq"),
        (dict(gamma=0), "gamma"),
        (dict(gamma=17), "gamma"),
        (dict(tokens=[]), "prompt"),
        (dict(tokens=[1, 100]), "out of range"),
        (dict(sample=True, temperature=-1.0), "temperature"),
        (dict(sample=True, temperature=float("nan")), "temperature"),
        (dict(sample=True, temperature=1e-30), "temperature"),  # sampled, yet below the greedy threshold
        (dict(sample=True, temperature=0.0), "temperature"),
        (dict(sample=True, temperature=1.0, top_p=2.0), "top_p"),
        (dict(sample=True, temperature=1.0, top_p=0.0), "top_p"),
        (dict(top_k=1000), "top_k"),
        (dict(rtt_seconds=float("inf")), "rtt_seconds"),
        (dict(occupancy=float("nan")), "occupancy"),
        (dict(occupancy=-0.5), "occupancy"),
    ],
)
def test_malformed_requests_are_invalid_argument(fields: dict, message: str) -> None:
    with pytest.raises(SessionError) as info:
        validate_request(_req(**fields), vocab_size=100, max_gamma=16, max_context=64)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.message


def test_a_release_needs_no_proposal_fields() -> None:
    assert (
        validate_request(_req(release=True, gamma=0, tokens=[]), vocab_size=100, max_gamma=16, max_context=64) is None
    )
    with pytest.raises(SessionError, match="gamma"):  # the same fields on a proposal request are refused
        validate_request(_req(release=False, gamma=0, tokens=[]), vocab_size=100, max_gamma=16, max_context=64)


def test_load_reports_utilisation_means_and_demand_over_the_window() -> None:
    clock = Clock()
    load = LoadTracker(window_seconds=10, clock=clock)
    clock.now += 10
    # 5 services of 1 s each in the last 10 s: 50 % busy, Tq = 1 s.
    for start in range(101, 111, 2):
        load.record_service(start, start + 1, requests=1)
    load.record_request(("t", 1), verify_seconds=2.0, transfer_seconds=0.5)
    load.record_request(("t", 2), verify_seconds=4.0, transfer_seconds=None)
    snap = load.snapshot(targets=2, queue_depth=0)
    assert snap.utilization == pytest.approx(0.5)
    assert (snap.tq_seconds, snap.tp_seconds, snap.tc_seconds) == (1.0, 3.0, 0.5)
    assert snap.active_sessions == 2
    # N* = ceil(1 + (3 + 2*0.5)/1) = 5; with 2 targets, 2*1 < C = 5: under-loaded.
    assert snap.recommended_targets == 5 and snap.regime == "UnderLoaded"
    clock.now += 20  # everything ages out of the window
    snap = load.snapshot(targets=2, queue_depth=0)
    assert snap.utilization == 0.0 and snap.active_sessions == 0 and snap.recommended_targets == 0


def test_load_reports_the_targets_latest_demand_within_the_window() -> None:
    clock = Clock()
    load = LoadTracker(window_seconds=10, clock=clock)
    load.record_demand("a", running=8, waiting=0, occupancy=0.5)
    load.record_demand("b", running=16, waiting=3, occupancy=1.0)
    load.record_demand("a", running=4, waiting=0, occupancy=0.25)  # the latest report of a target counts
    snap = load.snapshot(targets=2, queue_depth=0)
    assert (snap.running_requests, snap.waiting_requests, snap.target_occupancy) == (20, 3, 0.625)
    # A connected target that reports nothing counts as idle in the mean.
    assert load.snapshot(targets=4, queue_depth=0).target_occupancy == 0.3125
    load.forget_target("b")  # disconnected
    assert load.snapshot(targets=1, queue_depth=0).running_requests == 4
    clock.now += 11  # a target that sent nothing for the whole window had nothing running
    snap = load.snapshot(targets=1, queue_depth=0)
    assert (snap.running_requests, snap.waiting_requests, snap.target_occupancy) == (0, 0, 0.0)


def test_batched_service_time_is_split_over_the_batch() -> None:
    clock = Clock()
    load = LoadTracker(window_seconds=10, clock=clock)
    load.record_service(100.0, 100.008, requests=8)
    clock.now = 100.01
    assert load.snapshot(targets=1, queue_depth=0).tq_seconds == pytest.approx(0.001)


def test_an_emulated_draft_follows_its_batch_curve_and_extends_it() -> None:
    curve = BatchCurve.parse("1:0.004, 8:0.006")  # the system model's parser: one set of rules
    assert curve_time(curve, 1) == 0.004
    assert curve_time(curve, 8) == 0.006
    assert curve_time(curve, 4) == pytest.approx(0.004 + 0.002 * 3 / 7)
    assert curve_time(curve, 15) == pytest.approx(0.008)  # beyond the last point: along its slope
    assert curve_time(BatchCurve.parse("1:0.004"), 3) == pytest.approx(0.012)


def test_the_draft_command_refuses_a_bad_batch_curve(capsys: pytest.CaptureFixture[str]) -> None:
    from starsd.cli import main

    for bad, says in (("x:1", "B:SECONDS"), ("1:-1", "Tq(1)"), ("1:0.006,8:0.004", "must not fall")):
        assert main(["draft", "--emulate-service-time", "0.004", "--batch-curve", bad]) == 2
        assert says in capsys.readouterr().err, bad


class HeldProposer:
    """An emulated draft whose requests take ``service`` seconds of a fake clock, each held until released.

    ``started`` is set when a batch begins; the batch then waits for ``release`` and advances the clock by
    ``service`` per request: queue and service times come out exactly, whatever the machine's load.
    """

    def __init__(self, clock: Clock, service: float) -> None:
        from starsd.draft.proposers import EmulatedProposer

        self.inner = EmulatedProposer(0.0, vocab_size=100)
        self.info = self.inner.info
        self.clock, self.service = clock, service
        self.started, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def new_state(self, seed):  # type: ignore[no-untyped-def]
        return None

    def propose_batch(self, batch):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.started.set()
        assert self.release.wait(timeout=60), "never released"
        self.clock.now += self.service * len(batch)
        return self.inner.propose_batch(batch)

    def draft_ahead(self, stop):  # type: ignore[no-untyped-def]
        pass

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_answers_say_how_long_each_request_queued() -> None:
    """Two sessions ask at once of a draft that takes 50 ms per request: the second waits for the first."""
    import asyncio

    from starsd.draft.core import DraftConfig, DraftCore

    clock = Clock()
    proposer = HeldProposer(clock, 0.05)

    async def scenario() -> list[pb.ProposeResponse]:
        core = DraftCore(proposer, DraftConfig(max_batch=1), clock=clock)  # type: ignore[arg-type]
        core.start()
        try:
            stream = core.open_stream(asyncio.get_running_loop())
            for session in (1, 2):
                core.submit(stream, pb.ProposeRequest(target_id="t", session_id=session, seq=1, tokens=[1], gamma=2))
            proposer.release.set()  # both are queued at the same instant of the fake clock
            answers = []
            for _ in range(2):
                answer = await asyncio.wait_for(stream.outgoing.get(), 60)
                assert answer is not None
                answers.append(answer)
            return answers
        finally:
            core.stop()

    first, second = asyncio.run(scenario())
    assert first.queue_seconds == 0.0
    assert second.queue_seconds == pytest.approx(0.05)
    assert first.service_seconds == pytest.approx(0.05) and second.service_seconds == pytest.approx(0.05)


def test_discard_removes_a_gone_targets_items_under_both_policies() -> None:
    for policy in ("fifo", "fair"):
        buf: RequestBuffer[tuple[str, int]] = RequestBuffer(policy)
        for i in range(6):
            target = "a" if i % 2 else "b"
            buf.put(target, (target, i))
        assert buf.discard(lambda item: item[0] == "a") == 3
        assert len(buf) == 3
        assert buf.take(10) == [("b", 0), ("b", 2), ("b", 4)]


def test_a_disconnected_targets_queued_requests_are_not_computed() -> None:
    """A target with many queued requests goes away: the draft drops them instead of drafting for nobody."""
    import asyncio

    from starsd.draft.core import DraftConfig, DraftCore

    proposer = HeldProposer(Clock(), 0.05)

    async def scenario() -> tuple[DraftCore, int]:
        core = DraftCore(proposer, DraftConfig(max_batch=1))  # type: ignore[arg-type]
        core.start()
        try:
            stream = core.open_stream(asyncio.get_running_loop())
            for session in range(1, 9):
                core.submit(stream, pb.ProposeRequest(target_id="t", session_id=session, seq=1, tokens=[1], gamma=2))
            started = await asyncio.get_running_loop().run_in_executor(None, proposer.started.wait, 60)
            assert started  # the first request is being drafted, the other seven wait in the buffer
            core.close_stream(stream)
            waiting = len(core.buffer)
            proposer.release.set()
            return core, waiting
        finally:
            core.stop()  # joins the compute thread: whatever it would still compute, it has computed

    core, waiting = asyncio.run(scenario())
    assert waiting == 0
    assert proposer.calls == 1  # the one in flight only
    assert core.metrics.dropped._value.get() == 7
