"""Emulated targets speak the draft protocol correctly and draw acceptance per position (against a fake
draft servicer that records what it is sent)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator

import grpc
import pytest

from starsd import model
from starsd.bench.targets import EmulatedTarget, TargetSpec, draw_accepted, fetch_vocab_size, open_channel
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from tests.stats import chi2_critical, chi2_statistic

VOCAB = 1000


class RecordingDraft(pb_grpc.DraftServicer):
    """Answers each request at once with ids that name it (seq*100 + position); records every request."""

    def __init__(self) -> None:
        self.requests: list[pb.ProposeRequest] = []

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        return pb.InfoResponse(model_name="fake", vocab_size=VOCAB, max_gamma=16)

    async def Propose(
        self, request_iterator: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResponse]:
        async for req in request_iterator:
            self.requests.append(req)
            if req.release:
                continue
            yield pb.ProposeResponse(
                target_id=req.target_id,
                session_id=req.session_id,
                seq=req.seq,
                token_ids=[(req.seq * 100 + i) % VOCAB for i in range(req.gamma)],
                service_seconds=0.0001,
            )


async def run_targets(spec: TargetSpec, n: int, seconds: float) -> tuple[RecordingDraft, list[EmulatedTarget]]:
    server = grpc.aio.server()
    draft = RecordingDraft()
    pb_grpc.add_DraftServicer_to_server(draft, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        assert await fetch_vocab_size(address) == VOCAB
        channels = [open_channel(address) for _ in range(n)]
        targets = [EmulatedTarget(f"t{i}", ch, spec, seed=i) for i, ch in enumerate(channels)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(t.run(stop)) for t in targets]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        for ch in channels:
            await ch.close()
    finally:
        await server.stop(None)
    return draft, targets


def test_targets_follow_the_wire_protocol() -> None:
    spec = TargetSpec(
        gamma=4,
        betas=(0.9, 0.7, 0.5, 0.3),
        verify_seconds=0.003,
        wire_seconds=0.0005,
        vocab_size=VOCAB,
        prompt_tokens=7,
        session_tokens=40,
    )
    draft, targets = asyncio.run(run_targets(spec, n=3, seconds=0.6))
    for target in targets:
        run = target.run_record
        assert run.error is None
        assert len(run.rounds) > 10
        assert run.sessions >= 2  # 40 tokens per session at most 5 a round: sessions rotate
        mine = [r for r in draft.requests if r.target_id == target.target_id]
        by_session: dict[int, list[pb.ProposeRequest]] = {}
        for r in mine:
            by_session.setdefault(r.session_id, []).append(r)
        assert len(by_session) == run.sessions
        first = next(iter(by_session.values()))[0]
        assert first.verify_seconds == 0.0 and first.rtt_seconds == 0.0  # nothing measured yet
        rounds = iter(run.rounds)
        for session_requests in by_session.values():
            # seq 1, 2, 3, ... on every session, and every session ends with a release.
            assert [r.seq for r in session_requests] == list(range(1, len(session_requests) + 1))
            assert session_requests[-1].release and not any(r.release for r in session_requests[:-1])
            proposes = session_requests[:-1]
            assert len(proposes[0].tokens) == 7  # the prompt
            for prev, cur in itertools.pairwise(proposes):
                rnd = next(rounds)
                # accepted drafts of the previous answer (seq*100 + i), then the target's own token
                assert len(cur.tokens) == rnd.accepted + 1 == rnd.tokens
                assert list(cur.tokens[:-1]) == [(prev.seq * 100 + i) % VOCAB for i in range(rnd.accepted)]
                assert cur.gamma == 4 and cur.temperature == 0.0
                assert cur.verify_seconds > 0.0
                assert cur.rtt_seconds >= 2 * spec.wire_seconds  # the emulated wire is in the round trip
            next(rounds, None)  # the session's last answered round leads to its release, not a request


def test_acceptance_is_drawn_per_position_as_the_model_says() -> None:
    betas = (0.9, 0.6, 0.5, 0.8)
    rng = random.Random(7)
    counts = [0] * 5
    for _ in range(20_000):
        counts[draw_accepted(rng, betas)] += 1
    expected = model.accepted_length_distribution(4, betas=list(betas))
    stat, df = chi2_statistic(counts, expected)
    assert stat < chi2_critical(df)


def test_a_target_reports_a_draft_error_instead_of_hanging() -> None:
    class Failing(RecordingDraft):
        async def Propose(
            self, request_iterator: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[pb.ProposeResponse]:
            async for req in request_iterator:
                yield pb.ProposeResponse(
                    target_id=req.target_id,
                    session_id=req.session_id,
                    seq=req.seq,
                    error_code=3,
                    error_message="bad gamma",
                )

    async def go() -> EmulatedTarget:
        server = grpc.aio.server()
        pb_grpc.add_DraftServicer_to_server(Failing(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with open_channel(f"127.0.0.1:{port}") as ch:
            spec = TargetSpec(gamma=2, betas=(0.5, 0.5), verify_seconds=0.0, wire_seconds=0.0, vocab_size=VOCAB)
            target = EmulatedTarget("t", ch, spec, seed=1)
            await asyncio.wait_for(target.run(asyncio.Event()), 10)
        await server.stop(None)
        return target

    target = asyncio.run(go())
    assert target.run_record.error is not None and "bad gamma" in target.run_record.error


def test_target_spec_rejects_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="gamma"):
        TargetSpec(gamma=3, betas=(0.5,), verify_seconds=0.0, wire_seconds=0.0, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="times"):
        TargetSpec(gamma=1, betas=(0.5,), verify_seconds=-1.0, wire_seconds=0.0, vocab_size=VOCAB)
