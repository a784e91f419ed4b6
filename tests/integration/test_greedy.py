"""Greedy completions through the HTTP API equal the target model alone, token for token."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from starsd.local import LocalStar, http_json
from tests.integration.conftest import PROMPTS, Reference, start_star

MAX_TOKENS = 32
DRAFT_TIMEOUT = 120.0  # seconds: every round waits for its draft, however loaded the machine


@pytest.fixture(scope="module")
def star1(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    """One draft and one target whose rounds never give up on the draft: ``fallback_tokens == 0`` below is then
    a property of the code, not of how fast this machine answers within the default deadline."""
    star = start_star(
        shipped_pair,
        1,
        tmp_path_factory.mktemp("star1-greedy"),
        target_args=["--draft-timeout", str(DRAFT_TIMEOUT)],
        draft_args=["--draft-ahead", "on"],  # off by default on a CPU: checked here, outputs compared below
    )
    try:
        yield star
    finally:
        star.stop()


def complete(url: str, prompt: str | list[int], **kw: object) -> dict:
    status, body = http_json(
        f"{url}/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **kw}
    )
    assert status == 200, body
    return body


def test_one_target_one_draft_equals_the_target_alone(star1: LocalStar, reference: Reference) -> None:
    drafted = accepted = 0
    for prompt in PROMPTS:
        body = complete(star1.urls[0], prompt)
        assert body["starsd"]["token_ids"] == reference.greedy(prompt, MAX_TOKENS), prompt
        assert body["usage"]["completion_tokens"] == len(body["starsd"]["token_ids"])
        drafted += body["starsd"]["drafted_tokens"]
        accepted += body["starsd"]["accepted_tokens"]
        assert body["starsd"]["fallback_tokens"] == 0
    assert drafted > 0 and accepted > 0  # the draft really took part
    # While the target verified, the draft drafted ahead; rounds it predicted whole were answered from that
    # (the outputs above are the target's all the same).
    metrics = urllib.request.urlopen(f"http://{star1.host}:{star1.metrics_port}/metrics", timeout=10).read().decode()
    totals = {m.name: m.value for family in text_string_to_metric_families(metrics) for m in family.samples}
    assert totals["starsd_draft_ahead_hits_total"] > 0
    assert totals["starsd_draft_ahead_tokens_total"] <= totals["starsd_spec_decode_num_draft_tokens_total"]


def test_four_targets_sharing_one_draft_under_concurrent_load(star4: LocalStar, reference: Reference) -> None:
    jobs = [(star4.urls[i % 4], prompt) for i, prompt in enumerate(PROMPTS * 2)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        bodies = list(pool.map(lambda job: complete(*job), jobs))
    for (_, prompt), body in zip(jobs, bodies, strict=True):
        assert body["starsd"]["token_ids"] == reference.greedy(prompt, MAX_TOKENS), prompt
    assert {b["starsd"]["target"] for b in bodies} == {f"target-{i}" for i in range(4)}
    assert sum(b["starsd"]["accepted_tokens"] for b in bodies) > 0


def test_text_and_stop_sequences(star4: LocalStar, reference: Reference) -> None:
    prompt = "import os\nimport sys\n"
    full = complete(star4.urls[0], prompt)
    text = full["choices"][0]["text"]
    assert text == reference.model.tokenizer.decode(reference.greedy(prompt, MAX_TOKENS), skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = complete(star4.urls[0], prompt, stop=[stop])
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[: text.index(stop)]


def test_streaming_sends_the_same_text_as_one_response(star4: LocalStar) -> None:
    import json
    import urllib.request

    prompt = "class Parser:\n    def parse(self, text):\n"
    whole = complete(star4.urls[1], prompt)
    req = urllib.request.Request(
        f"{star4.urls[1]}/v1/completions",
        data=json.dumps(
            {
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for line in resp.read().decode().splitlines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    *events, usage = [json.loads(c) for c in chunks[:-1]]
    assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []  # OpenAI's usage chunk, asked for with stream_options
    assert usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_models_health_and_metrics_endpoints(star4: LocalStar) -> None:
    import urllib.request

    status, models = http_json(f"{star4.urls[0]}/v1/models")
    assert status == 200 and models["data"][0]["id"] == "target"
    assert http_json(f"{star4.urls[0]}/healthz")[0] == 200
    status, ready = http_json(f"{star4.urls[0]}/readyz")
    assert status == 200 and ready["draft_connected"] is True
    with urllib.request.urlopen(f"{star4.urls[0]}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert "starsd_spec_decode_num_accepted_tokens_total" in text
    status, load = http_json(star4.load_url)
    assert status == 200
    for key in (
        "utilization",
        "window_seconds",
        "tq_seconds",
        "tp_seconds",
        "tc_seconds",
        "queue_depth",
        "targets",
        "regime",
        "active_sessions",
        "recommended_targets",
        "running_requests",
        "waiting_requests",
        "target_occupancy",
    ):
        assert key in load
    assert load["targets"] == 4
