"""vLLM 0.32 (CPU) with StarSD's proposer and a StarSD draft on loopback, against the same vLLM without
speculation: greedy completions are identical (16 at once, mixed lengths, stop strings), the draft's /v1/load
sees the replica as a target and vLLM's own spec-decode metrics count its proposals, a draft killed mid-run
fails no request and changes no output and drafting resumes when it returns; a draft with another vocabulary
is refused at start-up with both fingerprints."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from starsd.local import LocalStar, http_json
from tests.vllm.conftest import NO_VLLM, START_SECONDS, VllmServer, running, speculative_config

pytestmark = [
    pytest.mark.skipif(NO_VLLM is not None, reason=NO_VLLM or ""),
    # Two vLLM servers start together on two cores before the first test: more than the suite's 600 s may go by.
    pytest.mark.timeout(int(START_SECONDS) + 600),
]

LONG = "import os\nimport sys\n\n" + "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(24))
PROMPTS = [
    "def __init__(self",
    "import os\nimport sys\n",
    "class Parser:\n    def parse(self, text):\n",
    "for i in range(",
    "    return self._",
    'if __name__ == "__main__":\n',
    "def read_file(path):\n    with open(",
    "try:\n    import ",
    "# Copyright",
    "    raise ValueError(",
    "self.assertEqual(",
    LONG,
    "def main():\n    parser = argparse.ArgumentParser(",
    "x = [",
    LONG[:300] + "class Config:\n",
    "while True:\n",
]


def request(i: int, prompt: str) -> dict[str, Any]:
    """Mixed lengths; every third with stop strings."""
    body: dict[str, Any] = {"model": "target", "prompt": prompt, "max_tokens": 8 + (i * 23) % 120, "temperature": 0}
    if i % 3 == 0:
        body["stop"] = ["\n\n", ")"]
    return body


def complete_all(server: VllmServer, bodies: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """The bodies sent at once; (status, text, finish_reason) of each."""

    def one(body: dict[str, Any]) -> tuple[int, str, str]:
        status, payload = http_json(f"{server.url}/v1/completions", body, timeout=600)
        if status != 200:
            return status, str(payload), ""
        choice = payload["choices"][0]
        return status, choice["text"], choice["finish_reason"]

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


@pytest.fixture(scope="module")
def draft(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    star = LocalStar(draft_model=shipped_pair[0], targets=0, log_dir=tmp_path_factory.mktemp("draft")).start()
    try:
        yield star
    finally:
        star.stop()


@pytest.fixture(scope="module")
def servers(
    draft: LocalStar, shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VllmServer, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm")
    plain = VllmServer("vLLM alone", shipped_pair[1], logs / "plain.log")
    spec = VllmServer(
        "vLLM + StarSD",
        shipped_pair[1],
        logs / "starsd.log",
        env={"STARSD_DRAFT": draft.draft_address, "STARSD_TARGET_ID": "vllm-0", "STARSD_DRAFT_TIMEOUT": "2"},
        speculative=speculative_config(4),
    )
    with running(plain, spec):
        yield plain, spec


def test_greedy_completions_are_identical_with_the_starsd_draft(
    servers: tuple[VllmServer, VllmServer], draft: LocalStar
) -> None:
    plain, spec = servers
    bodies = [request(i, p) for i, p in enumerate(PROMPTS)]
    expected = complete_all(plain, bodies)
    got = complete_all(spec, bodies)
    assert all(status == 200 for status, _, _ in expected + got), [r for r in expected + got if r[0] != 200]
    assert got == expected
    assert {reason for _, _, reason in got} == {"stop", "length"}  # both endings were exercised
    # vLLM's own spec-decode metrics count StarSD's proposals; the draft sees this replica as a target.
    metrics = spec.metrics()
    assert metrics["vllm:spec_decode_num_draft_tokens_total"] > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens_total"] > 0
    status, load = http_json(draft.load_url)
    assert status == 200 and load["targets"] == 1


def test_a_draft_killed_mid_run_fails_nothing_and_drafting_resumes(
    servers: tuple[VllmServer, VllmServer], draft: LocalStar
) -> None:
    plain, spec = servers
    bodies = [{"model": "target", "prompt": p, "max_tokens": 160, "temperature": 0} for p in PROMPTS]
    expected = complete_all(plain, bodies)
    before = spec.metrics()["vllm:spec_decode_num_draft_tokens_total"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(complete_all, spec, bodies)
        # Kill the draft once the run is under way (proposals flowing), not before it began.
        end = time.monotonic() + 120
        while spec.metrics()["vllm:spec_decode_num_draft_tokens_total"] < before + 64:
            assert time.monotonic() < end and not pending.done(), "the run never drafted before the kill"
            time.sleep(0.1)
        draft.kill_draft()
        got = pending.result()
    assert [status for status, _, _ in got] == [200] * len(bodies), got
    assert got == expected
    draft.restart_draft()
    after_restart = spec.metrics()["vllm:spec_decode_num_draft_tokens_total"]
    end = time.monotonic() + 120
    while spec.metrics()["vllm:spec_decode_num_draft_tokens_total"] == after_restart:
        assert time.monotonic() < end, "drafting did not resume after the draft came back"
        assert complete_all(spec, bodies[:2]) == expected[:2]
    log = spec.log_path.read_text(errors="replace")
    assert "lost the draft" in log  # the proposer said why those steps decoded alone


def test_a_draft_with_another_vocabulary_is_refused_at_start(
    mismatched_pair: tuple[Path, Path], shipped_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # The pair's draft has a tokenizer of its own: vLLM serving the shipped target must refuse it.
    with LocalStar(draft_model=mismatched_pair[0], targets=0, log_dir=tmp_path) as other:
        server = VllmServer(
            "vLLM + a foreign draft",
            shipped_pair[1],
            tmp_path / "refused.log",
            env={"STARSD_DRAFT": other.draft_address},
            speculative=speculative_config(4),
        ).start()
        try:
            code = server.wait_exit(900)
        finally:
            server.stop()
    log = server.log_path.read_text(errors="replace")
    assert code not in (None, 0), "vLLM started with a draft of another vocabulary"
    assert "does not share this target's vocabulary" in log
    assert log.count("fingerprint") >= 2
