"""The draft model in its own process: the same proposals as in the server's process, states freed, clear errors."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from starsd.checkpoints import ModelLoadError, load_checkpoint
from starsd.draft.model_process import ModelProcessGone, ProcessProposer
from starsd.draft.runner import DraftRunner
from starsd.proposals import DraftRequest
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
