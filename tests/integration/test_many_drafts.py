"""Two drafts and six targets, real processes on loopback: the targets split between the drafts, serve a concurrent
workload losslessly, and when one draft is killed mid-workload its targets move to the other within the reconnect
backoff, fail no request, and stop decoding alone once they moved."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from starsd.assignment import ordered_drafts
from starsd.local import LocalStar, http_json
from tests.integration.conftest import PROMPTS, Reference

TARGETS = 6
DRAFTS = 2
COMPLETIONS = 24
MOVE_SECONDS = 5.0  # the targets of a killed draft report the other one within this (the backoff is at most 2 s)
LATER_TOKENS = 48  # each completion sent to a moved target after its move
WAIT = 120.0  # settling on a loaded machine
START_TIMEOUT = 900.0  # eight processes loading torch at once on a small shared machine


@pytest.fixture(scope="module")
def star(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    # A long draft deadline: on a busy machine a slow answer would also send a round to fallback; this test
    # isolates the fallback that a lost draft causes.
    star = LocalStar(
        draft_model=shipped_pair[0],
        target_model=shipped_pair[1],
        targets=TARGETS,
        drafts=DRAFTS,
        log_dir=tmp_path_factory.mktemp("many-drafts"),
        target_args=["--draft-timeout", "30"],
    ).start(timeout=START_TIMEOUT)
    try:
        yield star
    finally:
        star.stop()


def ready(url: str) -> dict:
    status, body = http_json(f"{url}/readyz", timeout=10)
    assert status == 200, body
    return dict(body)


def metrics(url: str) -> dict[str, float]:
    """The target's samples by name (labelled ones as ``name{label=value}``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def complete(url: str, prompt: str | list[int], max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    status, out = http_json(f"{url}/v1/completions", body, timeout=600)
    assert status == 200, out
    return dict(out)


def workload(pool: ThreadPoolExecutor, star: LocalStar, max_tokens: int) -> list[tuple[str | list[int], Future]]:
    jobs = []
    for i in range(COMPLETIONS):
        prompt = PROMPTS[i % len(PROMPTS)]
        jobs.append((prompt, pool.submit(complete, star.urls[i % TARGETS], prompt, max_tokens)))
    return jobs


def first_choice(star: LocalStar, i: int) -> str:
    return ordered_drafts(f"target-{i}", star.draft_addresses)[0]


def on_first_choices(star: LocalStar) -> bool:
    """Every target uses its own first choice (one that found its draft still loading may use the other until
    it probes its first choice again)."""
    return all(ready(url)["draft_address"] == first_choice(star, i) for i, url in enumerate(star.urls))


def test_the_targets_split_between_the_drafts_and_serve_losslessly(star: LocalStar, reference: Reference) -> None:
    wait_until(lambda: on_first_choices(star), "every target uses its first-choice draft")
    per_draft = [sum(first_choice(star, i) == d for i in range(TARGETS)) for d in star.draft_addresses]
    assert per_draft == [TARGETS // DRAFTS] * DRAFTS
    for i, url in enumerate(star.urls):
        status = ready(url)
        assert status["draft_rank"] == 0 and status["drafts"] == ordered_drafts(f"target-{i}", star.draft_addresses)
        card = http_json(f"{url}/v1/models")[1]["data"][0]["starsd"]
        assert card["draft_address"] == first_choice(star, i) and card["draft_rank"] == 0
    for d, load_url in enumerate(star.load_urls):
        assert http_json(load_url)[1]["targets"] == per_draft[d]  # each draft sees its own targets

    max_tokens = 48
    for p in PROMPTS:
        reference.greedy(p, max_tokens)
    with ThreadPoolExecutor(max_workers=COMPLETIONS) as pool:
        jobs = workload(pool, star, max_tokens)
        bodies = [(prompt, f.result(timeout=600)) for prompt, f in jobs]
    for prompt, body in bodies:
        assert body["starsd"]["token_ids"] == reference.greedy(prompt, max_tokens), prompt
    assert all(b["starsd"]["drafted_tokens"] > 0 for _, b in bodies)  # every completion was drafted for


def test_killing_a_draft_moves_its_targets_to_the_other(star: LocalStar, reference: Reference) -> None:
    wait_until(lambda: on_first_choices(star), "every target uses its first-choice draft")
    victim, survivor = star.draft_addresses[1], star.draft_addresses[0]
    affected = [i for i in range(TARGETS) if first_choice(star, i) == victim]
    others = [i for i in range(TARGETS) if i not in affected]
    assert affected and others
    max_tokens = 160
    for p in PROMPTS:  # the oracle first, so the kill lands while requests are in flight
        reference.greedy(p, max_tokens)
    before = {i: metrics(star.urls[i]) for i in range(TARGETS)}

    with ThreadPoolExecutor(max_workers=COMPLETIONS) as pool:
        jobs = workload(pool, star, max_tokens)
        wait_until(
            lambda: (
                all(metrics(star.urls[i])["starsd_target_generated_tokens_total"] > 0 for i in affected)
                and all(
                    metrics(star.urls[i])["starsd_target_generated_tokens_total"]
                    > before[i]["starsd_target_generated_tokens_total"]
                    for i in affected
                )
            ),
            "the affected targets are generating",
        )
        star.kill_draft(1)  # SIGKILL: its streams break with no goodbye
        killed = time.monotonic()
        moved_after: dict[int, float] = {}
        while len(moved_after) < len(affected):
            for i in affected:
                if i not in moved_after and ready(star.urls[i])["draft_address"] == survivor:
                    moved_after[i] = time.monotonic() - killed
            assert time.monotonic() - killed < MOVE_SECONDS, f"not moved in {MOVE_SECONDS} s: {moved_after}"
            time.sleep(0.05)
        # Rounds that had already decided to decode alone finish within a step or two; then no more fallback.
        time.sleep(1.0)
        moved = {i: metrics(star.urls[i]) for i in affected}
        # Completions that start after the move (beside what is left of the first ones, however fast the machine
        # finished those): the moved targets draft for them with the survivor and decode nothing alone.
        later = [(p, pool.submit(complete, star.urls[i], p, LATER_TOKENS)) for i in affected for p in PROMPTS[:2]]
        bodies = [(prompt, f.result(timeout=600)) for prompt, f in jobs]
        later_bodies = [(prompt, f.result(timeout=600)) for prompt, f in later]

    for prompt, body in bodies:  # zero failed requests (complete() asserts 200), and lossless
        assert body["starsd"]["token_ids"] == reference.greedy(prompt, max_tokens), prompt
    for prompt, body in later_bodies:
        assert body["starsd"]["token_ids"] == reference.greedy(prompt, LATER_TOKENS), prompt
        assert body["starsd"]["fallback_tokens"] == 0 and body["starsd"]["drafted_tokens"] > 0, body["starsd"]
    for i in affected:
        status = ready(star.urls[i])
        assert status["draft_address"] == survivor and status["draft_rank"] == 1, status
        after = metrics(star.urls[i])
        assert after["starsd_target_draft_switches_total{reason=draft_lost}"] == (
            before[i]["starsd_target_draft_switches_total{reason=draft_lost}"] + 1
        )
        assert after["starsd_target_fallback_tokens_total"] == moved[i]["starsd_target_fallback_tokens_total"]
        # ... while the target kept generating on the other draft's proposals after it moved.
        assert after["starsd_target_generated_tokens_total"] > moved[i]["starsd_target_generated_tokens_total"]
        assert (
            after["starsd_spec_decode_num_draft_tokens_total"] > moved[i]["starsd_spec_decode_num_draft_tokens_total"]
        )
    for i in others:  # the survivor's own targets never moved
        status = ready(star.urls[i])
        assert status["draft_address"] == survivor and status["draft_rank"] == 0
        assert metrics(star.urls[i])["starsd_target_draft_switches_total{reason=draft_lost}"] == 0
    assert http_json(star.load_urls[0])[1]["targets"] == TARGETS  # the survivor now serves all six
