"""Emulated targets are the product's target engine and draft link with an emulated runner: they speak the
draft protocol as ``starsd target`` does and draw acceptance per position (against a fake draft servicer that
records what it is sent)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest

from starsd import system_model
from starsd.bench.emulated import (
    EmulatedTarget,
    EmulatedTargetRunner,
    RoundDraws,
    TargetRun,
    TargetSpec,
)
from starsd.bench.harness import draft_info
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from starsd.verifier.runner import StepRow
from tests.stats import chi2_critical, chi2_statistic

VOCAB = 1000


class RecordingDraft(pb_grpc.DraftServicer):
    """Answers each request at once with ids that name it (seq*100 + position); records every request, and sets
    ``enough`` once every one of ``targets`` targets has sent ``per_target`` requests."""

    def __init__(self, targets: int = 1, per_target: int = 40) -> None:
        self.requests: list[pb.ProposeRequest] = []
        self.targets, self.per_target = targets, per_target
        self.enough = asyncio.Event()

    def _record(self, req: pb.ProposeRequest) -> None:
        self.requests.append(req)
        counts = Counter(r.target_id for r in self.requests)
        if len(counts) >= self.targets and min(counts.values()) >= self.per_target:
            self.enough.set()

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        return pb.InfoResponse(model_name="fake", vocab_size=VOCAB, vocab_fingerprint="fake", max_gamma=16)

    async def Propose(
        self, request_iterator: AsyncIterator[pb.ProposeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProposeResponse]:
        async for req in request_iterator:
            self._record(req)
            if req.release:
                continue
            yield pb.ProposeResponse(
                target_id=req.target_id,
                session_id=req.session_id,
                seq=req.seq,
                token_ids=[(req.seq * 100 + i) % VOCAB for i in range(req.gamma)],
                service_seconds=0.0001,
            )


async def run_targets(draft: RecordingDraft, spec: TargetSpec, n: int) -> tuple[RecordingDraft, list[EmulatedTarget]]:
    """Run ``n`` emulated targets against ``draft`` until it has seen enough of each (no wall-clock duration)."""
    server = grpc.aio.server()
    pb_grpc.add_DraftServicer_to_server(draft, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        info = await draft_info(address)
        assert info.vocab_size == VOCAB
        targets = [EmulatedTarget(f"t{i}", address, info, spec, seed=i) for i in range(n)]
        await asyncio.gather(*(t.connect(10.0) for t in targets))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(t.run(stop)) for t in targets]
        # Until the draft has seen enough, or every target has ended on its own (a bound for liveness only).
        enough, ended = asyncio.ensure_future(draft.enough.wait()), asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wait([enough, ended], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        enough.cancel()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
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
    draft, targets = asyncio.run(run_targets(RecordingDraft(targets=3, per_target=30), spec, n=3))
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
        sessions = list(by_session.values())
        for number, session_requests in enumerate(sessions):
            # seq 1, 2, 3, ... on every session; a finished session is released (the last one may be cut off
            # by the stop: the draft frees it when the stream closes).
            assert [r.seq for r in session_requests] == list(range(1, len(session_requests) + 1))
            assert not any(r.release for r in session_requests[:-1])
            released = session_requests[-1].release
            assert released or number == len(sessions) - 1
            proposes = session_requests[:-1] if released else session_requests
            assert len(proposes[0].tokens) == 7  # the prompt
            for prev, cur in itertools.pairwise(proposes):
                rnd = next(rounds)
                # accepted drafts of the previous answer (seq*100 + i), then the target's own token
                assert len(cur.tokens) == rnd.accepted + 1 == rnd.tokens
                assert list(cur.tokens[:-1]) == [(prev.seq * 100 + i) % VOCAB for i in range(rnd.accepted)]
                assert cur.gamma == 4 and not cur.sample
                assert cur.verify_seconds > 0.0
                assert cur.rtt_seconds >= 2 * spec.wire_seconds  # the emulated wire is in the round trip
                assert cur.running_requests == 1 and cur.occupancy == 1.0  # one session of max-num-seqs 1
            next(rounds, None)  # the session's last answered round ends it: no request follows


def test_an_adaptive_target_chooses_gamma_per_round_within_its_bound() -> None:
    spec = TargetSpec(
        gamma=8, betas=(0.3,) * 8, verify_seconds=0.001, wire_seconds=0.0, vocab_size=VOCAB, adaptive=True
    )
    draft, targets = asyncio.run(run_targets(RecordingDraft(targets=1, per_target=40), spec, n=1))
    gammas = [r.gamma for r in draft.requests if not r.release]
    assert len(gammas) > 10 and all(1 <= g <= 8 for g in gammas)
    assert min(gammas) < 8  # a low acceptance with a cheap verify: shorter drafts pay
    assert targets[0].run_record.gammas == gammas[: len(targets[0].run_record.gammas)]


def test_acceptance_is_drawn_per_position_as_the_model_says() -> None:
    betas = (0.9, 0.6, 0.5, 0.8)
    draws = RoundDraws(betas, seed=7)
    counts = [0] * 5
    for _ in range(20_000):
        counts[draws(4)] += 1
    expected = system_model.accepted_length_distribution(4, betas=list(betas))
    stat, df = chi2_statistic(counts, expected)
    assert stat < chi2_critical(df)


def test_the_runner_commits_the_accepted_drafts_and_one_token_of_its_own() -> None:
    run = TargetRun("t")
    runner = EmulatedTargetRunner(0.0, lambda offered: min(2, offered), VOCAB, seed=1, run=run)
    session = runner.new_session([5, 6, 7])
    (outcome,) = runner.step([StepRow(session, drafts=[11, 12, 13])])
    assert outcome.accepted == 2 and outcome.tokens[:2] == [11, 12] and len(outcome.tokens) == 3
    assert session.committed == [5, 6, 7, *outcome.tokens] and session.cached_len == 5
    (decoded,) = runner.step([StepRow(session)])  # no drafts (a fallback round): one token of its own
    assert decoded.accepted == 0 and len(decoded.tokens) == 1
    assert run.sessions == 1 and [r.accepted for r in run.rounds] == [2]  # rounds with a proposal only
    assert run.gammas == [3]


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

    spec = TargetSpec(gamma=2, betas=(0.5, 0.5), verify_seconds=0.0, wire_seconds=0.0, vocab_size=VOCAB)
    _, (target,) = asyncio.run(run_targets(Failing(), spec, n=1))
    assert target.run_record.error is not None and "without the draft" in target.run_record.error


def test_round_draws_couple_every_gamma() -> None:
    # Another gamma on the same seed meets the same draws: its run is the other's, cut at its own gamma.
    short, long = RoundDraws((0.7,) * 8, seed=9), RoundDraws((0.7,) * 8, seed=9)
    runs = [(short(2), long(8)) for _ in range(500)]
    assert all(s == min(lg, 2) for s, lg in runs)
    assert any(lg > 2 for _, lg in runs)  # the longer gamma did accept more, sometimes
    with pytest.raises(ValueError):
        short(9)


def test_target_spec_rejects_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="gamma"):
        TargetSpec(gamma=3, betas=(0.5,), verify_seconds=0.0, wire_seconds=0.0, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="times"):
        TargetSpec(gamma=1, betas=(0.5,), verify_seconds=-1.0, wire_seconds=0.0, vocab_size=VOCAB)
