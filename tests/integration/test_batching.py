"""Continuous batching through the real servers: batched output is each completion's own, budgets hold.

The target here prefills in chunks of 16 tokens, so long prompts take several steps beside other sessions'
decodes; every check compares with the target alone (transformers' generate, greedy) or with itself unbatched.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from starsd.checkpoints import load_checkpoint
from starsd.local import LocalStar, http_json
from tests.integration.conftest import PROMPTS, Reference, metric, start_star

PREFILL_CHUNK = 16
LONG_PROMPT = "def parse(self, text):\n    result = []\n    for line in text.splitlines():\n" * 4


@pytest.fixture(scope="module")
def batching_star(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    star = start_star(
        shipped_pair,
        1,
        tmp_path_factory.mktemp("batching"),
        # A generous draft deadline: on a loaded machine a missed one makes a round decode alone, which changes
        # a sampled completion's random draws (the seeded test below is about batching, not deadlines).
        target_args=["--max-num-seqs", "32", "--max-prefill-tokens", str(PREFILL_CHUNK), "--draft-timeout", "60"],
    )
    try:
        yield star
    finally:
        star.stop()


def _workload(reference: Reference) -> list[dict[str, Any]]:
    """16 greedy completions: short and long prompts, different lengths, stop strings, some ending in EOS."""
    prompts: list[str | list[int]] = [*PROMPTS[:12], LONG_PROMPT, LONG_PROMPT[:90], [40, 41, 42, 43], "# Copyright"]
    bodies = []
    for i, prompt in enumerate(prompts):
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 8 + 5 * (i % 7), "temperature": 0}
        if i % 4 == 1:  # a stop string the greedy text reaches
            text = reference.model.tokenizer.decode(reference.greedy(prompt, body["max_tokens"]))
            if len(text) > 12:
                body["stop"] = text[6:9]
        bodies.append(body)
    return bodies


def _expected(reference: Reference, body: dict[str, Any]) -> str:
    tokenizer = reference.model.tokenizer
    text = tokenizer.decode(reference.greedy(body["prompt"], body["max_tokens"]), skip_special_tokens=True)
    if "stop" in body:
        text = text[: text.find(body["stop"])]
    return text


async def _complete(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def _leave_mid_stream(session: aiohttp.ClientSession, url: str) -> int:
    """Stream a long completion and hang up after a few chunks; returns the chunks read."""
    body = {"prompt": PROMPTS[0], "max_tokens": 400, "temperature": 0, "stream": True}
    chunks = 0
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data: "):
                chunks += 1
                if chunks == 3:
                    break
    return chunks


async def _batch(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        results = await asyncio.gather(
            *(_complete(session, url, b) for b in bodies),
            _leave_mid_stream(session, url),
            _leave_mid_stream(session, url),
        )
    assert results[-2:] == [3, 3]
    return list(results[:-2])  # type: ignore[arg-type]


def test_batched_greedy_completions_equal_the_target_alone_with_and_without_the_draft(
    batching_star: LocalStar, reference: Reference
) -> None:
    url = batching_star.urls[0]
    bodies = _workload(reference)
    assert len(bodies) == 16 and sum("stop" in b for b in bodies) >= 2
    rows_before = metric(f"{url}/metrics", "starsd_target_step_rows_sum")
    steps_before = metric(f"{url}/metrics", "starsd_target_step_rows_count")
    for with_draft in (True, False):
        if not with_draft:
            batching_star.kill_draft()
        outs = asyncio.run(_batch(url, bodies))
        for body, out in zip(bodies, outs, strict=True):
            assert out["choices"][0]["text"] == _expected(reference, body), (with_draft, body)
        drafted = sum(o["starsd"]["drafted_tokens"] for o in outs)
        assert (drafted > 0) == with_draft
    assert any(o["choices"][0]["finish_reason"] == "stop" for o in outs)
    rows = metric(f"{url}/metrics", "starsd_target_step_rows_sum") - rows_before
    steps = metric(f"{url}/metrics", "starsd_target_step_rows_count") - steps_before
    assert rows / steps > 2  # sessions really shared forward passes
    batching_star.restart_draft()
    batching_star.wait_linked()


def test_a_seeded_request_gives_the_same_text_alone_and_inside_a_batch(batching_star: LocalStar) -> None:
    url = batching_star.urls[0]
    seeded = {"prompt": "import os\n", "max_tokens": 32, "temperature": 0.9, "top_p": 0.95, "seed": 77}
    first = http_json(f"{url}/v1/completions", seeded)[1]
    alone = first["starsd"]["token_ids"]
    assert first["starsd"]["fallback_tokens"] == 0 and first["starsd"]["drafted_tokens"] > 0
    others = [{"prompt": p, "max_tokens": 32, "temperature": 0.7 + 0.1 * (i % 4)} for i, p in enumerate(PROMPTS[:16])]

    async def run() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return list(await asyncio.gather(*(_complete(session, url, b) for b in [*others, seeded])))

    together = asyncio.run(run())
    assert together[-1]["starsd"]["fallback_tokens"] == 0
    assert together[-1]["starsd"]["token_ids"] == alone


@pytest.fixture(scope="module")
def small_budget_star(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    """A target whose key/value budget fits two 80-token completions, and that accepts 6 at once."""
    args = ["--kv-cache-tokens", "200", "--max-num-seqs", "4", "--max-concurrency", "6"]
    star = start_star(shipped_pair, 1, tmp_path_factory.mktemp("budget"), target_args=args)
    try:
        yield star
    finally:
        star.stop()


def test_over_the_budget_requests_wait_or_get_429_and_none_fails(
    small_budget_star: LocalStar, reference: Reference
) -> None:
    url = small_budget_star.urls[0]
    body = {"prompt": "def test_", "max_tokens": 64, "temperature": 0}

    async def one(session: aiohttp.ClientSession) -> tuple[int, str, str | None]:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            payload = await resp.json()
            text = payload["choices"][0]["text"] if resp.status == 200 else json.dumps(payload)
            return resp.status, text, resp.headers.get("Retry-After")

    async def run() -> list[tuple[int, str, str | None]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            return list(await asyncio.gather(*(one(session) for _ in range(12))))

    results = asyncio.run(run())
    statuses = sorted(s for s, _, _ in results)
    assert set(statuses) == {200, 429}, statuses
    assert statuses.count(200) >= 6  # two run, the rest of the six accepted waited for their turn
    expected = _expected(reference, body)
    assert all(text == expected for s, text, _ in results if s == 200)
    assert all(retry == "1" for s, _, retry in results if s == 429)
    status, error = http_json(f"{url}/v1/completions", {**body, "max_tokens": 400})
    assert status == 400 and "key/value budget" in error["error"]["message"]


def test_bfloat16_on_the_cpu_serves_and_says_so(shipped_pair: tuple[Path, Path], tmp_path: Path) -> None:
    star = start_star(shipped_pair, 1, tmp_path, dtype="bfloat16", device="cpu")
    try:
        models = http_json(f"{star.urls[0]}/v1/models")[1]["data"][0]["starsd"]
        assert models["dtype"] == "bfloat16" and models["device"] == "cpu"
        load = http_json(star.load_url)[1]
        assert load["dtype"] == "bfloat16"
        status, out = http_json(
            f"{star.urls[0]}/v1/completions", {"prompt": "def f(", "max_tokens": 16, "temperature": 0}
        )
        assert status == 200 and out["usage"]["completion_tokens"] > 0 and out["starsd"]["drafted_tokens"] > 0
    finally:
        star.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device is visible: the GPU variant is skipped")
def test_on_cuda_batched_greedy_equals_the_target_alone(shipped_pair: tuple[Path, Path], tmp_path: Path) -> None:
    star = start_star(shipped_pair, 1, tmp_path, device="cuda", dtype="float32")
    try:
        reference = Reference(load_checkpoint(shipped_pair[1]))
        bodies = [{"prompt": p, "max_tokens": 24, "temperature": 0} for p in PROMPTS[:8]]
        outs = asyncio.run(_batch(star.urls[0], bodies))
        assert [o["choices"][0]["text"] for o in outs] == [_expected(reference, b) for b in bodies]
    finally:
        star.stop()


def test_bench_serve_reports_the_serving_figures_of_an_endpoint(batching_star: LocalStar, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "serve.json"
    argv = [sys.executable, "-m", "starsd.cli", "bench", "serve", "--url", batching_star.urls[0]]
    argv += ["--concurrency", "1,4", "--requests", "8", "--max-tokens", "12", "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "TTFT" in done.stdout and "output tokens/s" in done.stdout
    passes = json.loads(out.read_text())["passes"]
    assert [p["config"]["concurrency"] for p in passes] == [1, 4]
    for p in passes:
        assert p["completed"] == 8 and p["failed"] == 0
        assert p["output_tokens"] == 8 * 12  # ignore_eos: every request runs to max_tokens
        assert 0 < p["ttft_s"]["p50"] <= p["e2e_latency_s"]["p50"]
        assert p["output_throughput"] > 0 and p["tpot_s"]["mean"] > 0
