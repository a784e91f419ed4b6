"""StarSD's vLLM proposer against a real StarSD draft on loopback, driven as vLLM's model runner drives it
(rows of token ids, no request ids), with no vLLM installed: proposals are the draft's greedy continuation,
rows that move keep their sessions, the replica shows on the draft's /v1/load as a target, a draft that dies
costs no step more than the bound and drafting resumes when it returns, another vocabulary is refused."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from starsd.bench.vllm_compare import draft_side, draft_totals
from starsd.checkpoints import LoadedModel, load_checkpoint
from starsd.integrations.vllm import StarSDProposer
from starsd.local import LocalStar, http_json
from starsd.verifier.draft_client import VocabularyMismatch
from tests.support.reference import autoregressive_reference

GAMMA = 4
MAX_MODEL_LEN = 256


def vllm_config(target: Path, num_speculative_tokens: int = GAMMA) -> Any:
    """The parts of vLLM's VllmConfig the proposer reads."""
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    model_config = SimpleNamespace(
        tokenizer=str(target), max_model_len=MAX_MODEL_LEN, get_vocab_size=lambda: vocab_size, trust_remote_code=False
    )
    return SimpleNamespace(
        model_config=model_config,
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        speculative_config=SimpleNamespace(num_speculative_tokens=num_speculative_tokens),
    )


@pytest.fixture(scope="module")
def draft(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    star = LocalStar(draft_model=shipped_pair[0], targets=0, log_dir=tmp_path_factory.mktemp("vllm-draft")).start()
    try:
        yield star
    finally:
        star.stop()


@pytest.fixture(scope="module")
def draft_model(shipped_pair: tuple[Path, Path]) -> LoadedModel:
    return load_checkpoint(shipped_pair[0])


@pytest.fixture
def proposer(
    draft: LocalStar, shipped_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[StarSDProposer]:
    monkeypatch.setenv("STARSD_DRAFT", draft.draft_address)
    monkeypatch.setenv("STARSD_TARGET_ID", "vllm-7")
    monkeypatch.setenv("STARSD_DRAFT_TIMEOUT", "5")  # generous: the draft shares two cores with this test
    monkeypatch.setenv("STARSD_COOLDOWN_STEPS", "2")
    p = StarSDProposer(vllm_config(shipped_pair[1]))
    try:
        yield p
    finally:
        p.close()


class Batch:
    """vLLM's persistent batch as the proposer sees it: token_ids_cpu, num_tokens_no_spec, sampled ids."""

    def __init__(self, contexts: list[list[int]]) -> None:
        self.contexts = contexts

    def step(self, proposer: StarSDProposer) -> list[list[int]]:
        tokens = np.zeros((len(self.contexts), MAX_MODEL_LEN), dtype=np.int32)
        for i, ctx in enumerate(self.contexts):
            tokens[i, : len(ctx)] = ctx
        lengths = np.array([len(c) for c in self.contexts], dtype=np.int32)
        return proposer.propose([[c[-1]] for c in self.contexts], lengths, tokens, slot_mappings=None)


def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.05)


def prompts(draft_model: LoadedModel) -> list[list[int]]:
    texts = ["def __init__(self", "import os\nimport sys\n", "for i in range(", "class Parser:\n    def parse("]
    return [draft_model.tokenizer.encode(t) for t in texts]


def test_proposals_are_the_drafts_greedy_continuation_as_rows_move(
    proposer: StarSDProposer, draft_model: LoadedModel, draft: LocalStar
) -> None:
    wait_for(lambda: proposer.link.connected, "the proposer is connected")
    before = draft_totals(draft)
    contexts = prompts(draft_model)
    batch = Batch([list(c) for c in contexts])
    for step in range(4):
        proposals = batch.step(proposer)
        for ctx, got in zip(batch.contexts, proposals, strict=True):
            assert got == autoregressive_reference(draft_model, ctx, GAMMA), f"step {step}, context {ctx}"
        # vLLM accepts some tokens: the first proposal and a token of its own; then rows move (reordered, and
        # the second request finishes so the last row takes its place).
        pairs = zip(batch.contexts, proposals, strict=True)
        batch.contexts = [[*ctx, got[0], (ctx[-1] + 1) % 100] for ctx, got in pairs]
        if step == 1:
            batch.contexts = [batch.contexts[3], batch.contexts[0], batch.contexts[2]]
    # One session per completion still running: none was reopened when its row moved (sessions opened = 4).
    assert len(proposer.sessions) == 3 + 1  # the finished one is freed once idle
    assert proposer.steps_missed == 0
    status, load = http_json(draft.load_url)
    assert status == 200 and load["targets"] == 1
    # Every request after a session's first reported the replica's step and its round trip: 4 + 3 + 3 of them.
    side = draft_side(before, draft_totals(draft))
    assert side.requests == 4 + 4 + 3 + 3
    after = draft_totals(draft)
    for metric in ("starsd_draft_target_verify_seconds", "starsd_draft_transfer_seconds"):
        assert after[f"{metric}_count"] - before.get(f"{metric}_count", 0.0) == 10, metric
    assert side.verify_ms is not None and side.verify_ms > 0
    assert side.transfer_ms is not None and side.service_ms is not None


def test_idle_sessions_are_freed_on_the_draft(
    proposer: StarSDProposer, draft_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_for(lambda: proposer.link.connected, "the proposer is connected")
    proposer.config = type(proposer.config)(**{**proposer.config.__dict__, "idle_steps": 2})
    first, second = prompts(draft_model)[:2]
    Batch([first, second]).step(proposer)
    assert len(proposer.sessions) == 2
    for _ in range(3):
        Batch([first]).step(proposer)
    assert len(proposer.sessions) == 1


def test_a_dead_draft_costs_no_proposals_and_drafting_resumes(
    proposer: StarSDProposer, draft_model: LoadedModel, draft: LocalStar
) -> None:
    wait_for(lambda: proposer.link.connected, "the proposer is connected")
    batch = Batch(prompts(draft_model)[:2])
    assert all(batch.step(proposer))
    draft.kill_draft()
    started = time.monotonic()
    for _ in range(5):
        assert batch.step(proposer) == [[], []]
    assert time.monotonic() - started < 5 * (proposer.config.timeout + 1.0)
    draft.restart_draft()
    wait_for(lambda: proposer.link.connected, "the proposer reconnected")

    def drafting() -> bool:
        return all(batch.step(proposer))

    wait_for(drafting, "proposals come back")
    assert [len(p) for p in batch.step(proposer)] == [GAMMA, GAMMA]


def test_a_fault_in_the_proposer_never_fails_vllms_step(
    proposer: StarSDProposer, draft_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_for(lambda: proposer.link.connected, "the proposer is connected")
    batch = Batch(prompts(draft_model)[:2])
    assert all(batch.step(proposer))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    with monkeypatch.context() as m:
        m.setattr(proposer.link, "burst", broken)
        assert batch.step(proposer) == [[], []]
    assert proposer.steps_failed == 1 and proposer.sessions == {}
    assert all(batch.step(proposer))  # afresh: new sessions, told the whole context


def test_a_frozen_draft_costs_one_bounded_step_then_a_cooldown(
    draft: LocalStar, shipped_pair: tuple[Path, Path], draft_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft that stops answering (SIGSTOP: the connection stays up) holds a step no longer than
    STARSD_DRAFT_TIMEOUT; the following STARSD_COOLDOWN_STEPS steps do not ask; drafting resumes after."""
    monkeypatch.setenv("STARSD_DRAFT", draft.draft_address)
    monkeypatch.setenv("STARSD_DRAFT_TIMEOUT", "0.3")
    monkeypatch.setenv("STARSD_COOLDOWN_STEPS", "3")
    p = StarSDProposer(vllm_config(shipped_pair[1]))
    process = draft.draft
    assert process is not None
    try:
        wait_for(lambda: p.link.connected, "the proposer is connected")
        batch = Batch(prompts(draft_model)[:2])
        wait_for(lambda: all(batch.step(p)), "the draft answers")  # its first answers may take a while
        process.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert batch.step(p) == [[], []]
            assert time.monotonic() - started < 0.3 + 1.0  # the bound, with room for a loaded machine
            assert p.steps_missed == 1
            drafted = p.steps_drafted
            for _ in range(3):
                assert batch.step(p) == [[], []]
            assert p.steps_drafted == drafted  # the cooldown steps did not ask
        finally:
            process.signal(signal.SIGCONT)
        wait_for(lambda: all(batch.step(p)), "proposals come back")
    finally:
        p.close()


def test_another_vocabulary_is_refused_with_both_fingerprints(
    draft: LocalStar, mismatched_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STARSD_DRAFT", draft.draft_address)
    wait_for(lambda: http_json(draft.load_url)[0] == 200, "the draft is up")
    # The pair's draft has the other tokenizer: served by "vLLM" here, it meets the shipped draft's vocabulary.
    with pytest.raises(VocabularyMismatch) as info:
        StarSDProposer(vllm_config(mismatched_pair[0]))
    message = str(info.value)
    assert message.count("fingerprint") == 2


def test_an_unreachable_draft_at_start_means_decoding_alone(
    shipped_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from starsd.local import free_port

    monkeypatch.setenv("STARSD_DRAFT", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("STARSD_DRAFT_CHECK_TIMEOUT", "0.5")
    p = StarSDProposer(vllm_config(shipped_pair[1]))
    try:
        assert Batch([[5, 6, 7]]).step(p) == [[]]
    finally:
        p.close()


def test_drafts_found_by_dns_as_a_starsd_cluster_gives_them(
    draft: LocalStar, draft_model: LoadedModel, shipped_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``STARSD_DRAFT=dns:HOST:PORT`` (what the operator gives a vLLM pool): the name is looked up, the draft
    behind it answers the vocabulary check and drafts, and the link keeps following the name."""
    host, port = draft.draft_address.rsplit(":", 1)
    monkeypatch.setenv("STARSD_DRAFT", f"dns:{host}:{port}")  # an address literal resolves to itself
    monkeypatch.setenv("STARSD_TARGET_ID", "chat-target-v-0")
    monkeypatch.setenv("STARSD_DRAFT_TIMEOUT", "5")
    p = StarSDProposer(vllm_config(shipped_pair[1]))
    try:
        assert p.link.drafts == [draft.draft_address]
        assert p.link.client.drafts_from == f"dns:{host}:{port}"
        wait_for(lambda: p.link.connected, "the proposer is connected")
        [context] = prompts(draft_model)[:1]
        assert Batch([list(context)]).step(p) == [autoregressive_reference(draft_model, context, GAMMA)]
    finally:
        p.close()
