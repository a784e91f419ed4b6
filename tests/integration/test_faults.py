"""A draft killed mid-flight loses no request and changes no output; a restarted draft is used again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from starsd import procfs
from starsd.local import LocalStar, http_json
from tests.integration.conftest import PROMPTS, Reference, metric, start_star

MAX_TOKENS = 160


@pytest.fixture(scope="module")
def star2(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    star = start_star(shipped_pair, 2, tmp_path_factory.mktemp("star-faults"))
    try:
        yield star
    finally:
        star.stop()


def _complete(url: str, prompt: str | list[int]) -> dict:
    status, body = http_json(f"{url}/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200, body
    return body


def _wait_linked(star: LocalStar, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(http_json(f"{u}/readyz")[1].get("draft_connected") for u in star.urls):
            return
        time.sleep(0.2)
    raise AssertionError("targets did not reconnect to the restarted draft")


def _wait_in_flight(star: LocalStar, rounds_before: list[float], timeout: float = 60.0) -> None:
    """Until every target has requests open and has run a round since ``rounds_before``:
    a kill after this lands mid-flight however fast the machine is (a fixed sleep did not on a fast one)."""
    urls = [f"{u}/metrics" for u in star.urls]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rounds = [metric(u, "starsd_target_rounds_total") for u in urls]
        active = [metric(u, "starsd_target_active_requests") for u in urls]
        if all(r > b for r, b in zip(rounds, rounds_before, strict=True)) and all(a > 0 for a in active):
            return
        time.sleep(0.01)
    raise AssertionError("the requests were not seen in flight on every target")


def test_draft_killed_during_requests_then_restarted(star2: LocalStar, reference: Reference) -> None:
    prompts = PROMPTS[:8]
    for p in prompts:  # compute the oracle first, so the kill lands while requests are in flight
        reference.greedy(p, MAX_TOKENS)
    rounds_before = [metric(f"{u}/metrics", "starsd_target_rounds_total") for u in star2.urls]
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(_complete, star2.urls[i % 2], p) for i, p in enumerate(prompts)]
        _wait_in_flight(star2, rounds_before)
        star2.kill_draft()  # SIGKILL
        bodies = [f.result(timeout=300) for f in futures]
    for prompt, body in zip(prompts, bodies, strict=True):
        assert body["starsd"]["token_ids"] == reference.greedy(prompt, MAX_TOKENS), prompt
    assert sum(b["starsd"]["fallback_tokens"] for b in bodies) > 0  # the kill happened mid-flight
    # Serving goes on without a draft.
    alone = _complete(star2.urls[0], PROMPTS[9])
    assert alone["starsd"]["drafted_tokens"] == 0 and alone["starsd"]["fallback_tokens"] > 0
    assert alone["starsd"]["token_ids"] == reference.greedy(PROMPTS[9], MAX_TOKENS)

    star2.restart_draft()
    _wait_linked(star2)
    again = _complete(star2.urls[1], PROMPTS[10])
    assert again["starsd"]["drafted_tokens"] > 0 and again["starsd"]["fallback_tokens"] == 0
    assert again["starsd"]["token_ids"] == reference.greedy(PROMPTS[10], MAX_TOKENS)


def test_a_dead_model_process_stops_the_draft_with_its_reason(star2: LocalStar, reference: Reference) -> None:
    """The model runs in a child of the draft; if it dies, the draft exits with status 1 and says why."""
    _wait_linked(star2)
    assert star2.draft is not None and star2.draft.popen is not None
    children = procfs.descendants(star2.draft.popen.pid)
    models = [p for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(models) == 1, f"expected one model process below the draft, found {children}"
    os.kill(models[0], signal.SIGKILL)
    # Noticed while idle, without waiting for a request: Kubernetes restarts a draft that exits.
    assert star2.draft.wait(30) == 1, star2.draft.log_tail()
    assert "the draft model process" in star2.draft.log_tail()
    body = _complete(star2.urls[0], PROMPTS[11])  # the targets serve on alone
    assert body["starsd"]["token_ids"] == reference.greedy(PROMPTS[11], MAX_TOKENS)
    star2.restart_draft()
    _wait_linked(star2)
    again = _complete(star2.urls[1], PROMPTS[12])
    assert again["starsd"]["drafted_tokens"] > 0
    assert again["starsd"]["token_ids"] == reference.greedy(PROMPTS[12], MAX_TOKENS)
