"""The draft model in its own process: the same proposals as in the server's process, states freed, clear errors,
and the server's event loop driving it (batches, the gather bound, its death)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from starsd.checkpoints import ModelLoadError, load_checkpoint
from starsd.draft.core import DraftConfig, DraftCore, Stream
from starsd.draft.model_process import ModelProcessGone, ProcessProposer
from starsd.draft.runner import DraftRunner
from starsd.proposals import DraftRequest
from starsd.proto import starsd_pb2 as pb
from starsd.sampling import SamplingParams

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)


@pytest.fixture(scope="module")
def remote(random_pair: tuple[Path, Path]) -> Iterator[ProcessProposer]:
    proposer = ProcessProposer(random_pair[0])
    try:
        yield proposer
    finally:
        proposer.close()


def test_proposals_match_the_model_in_this_process(remote: ProcessProposer, random_pair: tuple[Path, Path]) -> None:
    local = DraftRunner(load_checkpoint(random_pair[0]))
    assert remote.info.vocab_size == local.vocab_size
    gen = torch.Generator().manual_seed(3)
    params = [GREEDY, SAMPLED, GREEDY, SAMPLED]
    here = [local.new_state(seed=10 + i) for i in range(4)]
    there = [remote.new_state(seed=10 + i) for i in range(4)]
    new = [[5, 6, 7], [8, 9], [10], [11, 12, 13, 14]]
    for gammas in ([4, 3, 2, 1], [2, 4, 4, 3], [1, 1, 4, 2]):
        expected = local.propose_batch(
            [DraftRequest(s, t, g, p, 6) for s, t, g, p in zip(here, new, gammas, params, strict=True)]
        )
        got = remote.propose_batch(
            [DraftRequest(s, t, g, p, 6) for s, t, g, p in zip(there, new, gammas, params, strict=True)]
        )
        assert [p.token_ids for p in got] == [p.token_ids for p in expected]
        assert [p.q_ids for p in got] == [p.q_ids for p in expected]
        for a, b in zip(got, expected, strict=True):
            for qa, qb in zip(a.q_probs, b.q_probs, strict=True):
                assert qa == pytest.approx(qb, abs=1e-6)
        new = [[*p.token_ids[:1], int(torch.randint(0, local.vocab_size, (), generator=gen))] for p in expected]


def test_dropped_sessions_are_freed_in_the_model_process(remote: ProcessProposer) -> None:
    before = remote.states_held()
    states = [remote.new_state(seed=None) for _ in range(5)]
    remote.propose_batch([DraftRequest(s, [1, 2, 3], 2, GREEDY, 8) for s in states])
    assert remote.states_held() == before + 5
    del states
    gc.collect()
    assert remote.states_held() == before


def test_a_wrong_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        ProcessProposer(tmp_path / "missing")


def test_a_killed_model_process_is_reported(random_pair: tuple[Path, Path]) -> None:
    proposer = ProcessProposer(random_pair[0])
    try:
        proposer.check()
        assert proposer.pid is not None
        os.kill(proposer.pid, signal.SIGKILL)
        with pytest.raises(ModelProcessGone, match=r"is gone|exited"):
            proposer.propose_batch([DraftRequest(proposer.new_state(None), [1, 2], 2, GREEDY, 8)])
        with pytest.raises(ModelProcessGone, match="exited"):
            proposer.check()
    finally:
        proposer.close()


def test_the_draft_server_process_leaves_torch_to_its_model_process(random_pair: tuple[Path, Path]) -> None:
    """The server speaks gRPC and schedules; only the model process loads torch (memory, start-up time)."""
    import subprocess
    import sys
    import time

    from starsd import procfs
    from starsd.local import free_port

    def loads_torch(pid: int) -> bool:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()

    command = [sys.executable, "-m", "starsd.cli", "draft", "--model", str(random_pair[0])]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), "--metrics-port", str(free_port())]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        models: list[int] = []
        while time.monotonic() < deadline and not models:
            models = [
                p
                for p in procfs.descendants(server.pid)
                if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes() and loads_torch(p)
            ]
            time.sleep(0.5)
        assert models, "no model process with torch loaded appeared below the draft"
        assert not loads_torch(server.pid)
    finally:
        server.terminate()
        server.wait(30)


def test_the_model_process_reports_how_it_drafts(remote: ProcessProposer) -> None:
    assert remote.info.passes == "lean passes, drafting ahead off"  # a Llama draft on a CPU, --draft-ahead auto


# --- the server's event loop driving the model process (no compute thread) ------------------------------------


def _ask(session: int, tokens: list[int], following: int = 0) -> pb.ProposeRequest:
    return pb.ProposeRequest(target_id="t", session_id=session, seq=1, tokens=tokens, gamma=3, following=following)


async def _answers(stream: Stream, count: int) -> list[pb.ProposeResponse]:
    answers = []
    for _ in range(count):
        answer = await asyncio.wait_for(stream.outgoing.get(), 60)
        assert answer is not None
        answers.append(answer)
    return answers


def test_the_event_loop_drives_the_model_process_and_batches_a_burst(random_pair: tuple[Path, Path]) -> None:
    """A burst of three requests is drafted as one batch, sent and answered on the event loop with no thread of
    the draft's own, and its proposals are the model's in this process."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]

    async def scenario() -> tuple[list[pb.ProposeResponse], list[str], float | None]:
        core = DraftCore(ProcessProposer(random_pair[0]), DraftConfig(max_batch=8, gather_seconds=30.0))
        core.start()
        try:
            threads = [t.name for t in threading.enumerate()]
            stream = core.open_stream(asyncio.get_running_loop())
            for i, tokens in enumerate(prompts):  # announced: the first two wait for the third, not for 30 s
                core.submit(stream, _ask(i + 1, tokens, following=len(prompts) - 1 - i))
            answers = await _answers(stream, len(prompts))
            return answers, threads, core.metrics.registry.get_sample_value("starsd_draft_batch_size_sum")
        finally:
            core.stop()

    answers, threads, batched = asyncio.run(scenario())
    assert "draft-compute" not in threads
    assert batched == 3  # one batch of three
    local = DraftRunner(load_checkpoint(random_pair[0]))
    expected = local.propose_batch([DraftRequest(local.new_state(None), t, 3, GREEDY, 8) for t in prompts])
    assert sorted((a.session_id, list(a.token_ids)) for a in answers) == [
        (i + 1, p.token_ids) for i, p in enumerate(expected)
    ]
    assert all(a.error_code == 0 and a.service_seconds > 0 for a in answers)


def test_a_batch_waits_for_an_announced_request_no_longer_than_the_gather_bound(
    random_pair: tuple[Path, Path],
) -> None:
    async def scenario() -> tuple[list[pb.ProposeResponse], float]:
        core = DraftCore(ProcessProposer(random_pair[0]), DraftConfig(max_batch=8, gather_seconds=0.2))
        core.start()
        try:
            stream = core.open_stream(asyncio.get_running_loop())
            started = time.monotonic()
            core.submit(stream, _ask(1, [5, 6], following=1))  # its burst's second request never comes
            answers = await _answers(stream, 1)
            return answers, time.monotonic() - started
        finally:
            core.stop()

    answers, waited = asyncio.run(scenario())
    assert answers[0].error_code == 0 and len(answers[0].token_ids) == 3
    assert waited >= 0.2


def test_a_model_process_killed_under_the_event_loop_answers_its_batch_and_fails_the_draft(
    random_pair: tuple[Path, Path],
) -> None:
    """Killed while a batch is on the pipe: the batch is answered UNAVAILABLE, the draft fails with the reason."""

    async def scenario() -> tuple[str | None, pb.ProposeResponse]:
        proposer = ProcessProposer(random_pair[0])
        core = DraftCore(proposer, DraftConfig(max_batch=8))
        core.start()
        try:
            assert proposer.pid is not None
            stream = core.open_stream(asyncio.get_running_loop())
            long_ask = _ask(1, list(range(3, 500)))
            long_ask.gamma = 16  # tens of milliseconds of drafting: the kill comes first
            core.submit(stream, long_ask)  # sent down the pipe at once
            os.kill(proposer.pid, signal.SIGKILL)
            (answer,) = await _answers(stream, 1)
            await asyncio.wait_for(core.failed.wait(), 30)
            return core.failure, answer
        finally:
            core.stop()

    failure, answer = asyncio.run(scenario())
    assert answer.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "the draft model process" in answer.error_message
    assert failure is not None and "the draft model process" in failure
