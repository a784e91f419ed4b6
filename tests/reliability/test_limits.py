"""Limits that protect the servers: body size (413), the max_tokens cap, the context length, a per-target
concurrency limit answering 429 with Retry-After, and the draft's gRPC message size limit. Each refusal is clear
and the server goes on serving.

A dedicated target (``--max-concurrency 1 --max-tokens-cap 64 --max-body-bytes 65536``) shares the star's draft
through a fault proxy of its own: a delay on that link makes its completions take seconds, which is how a test
holds the one slot while it knocks again.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from starsd.local import http_json
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from tests.integration.conftest import Reference
from tests.reliability.conftest import (
    ProxiedStar,
    Target,
    draft_metrics,
    long_greedy_prompts,
    make_healthy,
    start_target,
    wait_for,
    wait_sessions_freed,
)
from tests.reliability.workload import HeldStream
from tests.support.faults import ThreadedFaultProxy

MAX_BODY = 65536
TOKENS_CAP = 64


@dataclass
class Limited:
    target: Target
    proxy: ThreadedFaultProxy
    star: ProxiedStar

    @property
    def url(self) -> str:
        return self.target.url


@pytest.fixture(scope="module")
def limited(proxied_star: ProxiedStar) -> Iterator[Limited]:
    star = make_healthy(proxied_star)
    proxy = ThreadedFaultProxy("127.0.0.1", star.star.draft_port).start()
    target = None
    try:
        args = ["--max-concurrency", "1", "--max-tokens-cap", str(TOKENS_CAP), "--max-body-bytes", str(MAX_BODY)]
        target = start_target(star.pair[1], proxy.address, "limited", star.log_dir, [*args, "--draft-timeout", "5"])
        yield Limited(target, proxy, star)
    finally:
        if target is not None:
            target.stop()
        proxy.stop()


@pytest.fixture
def plain_link(limited: Limited) -> Limited:
    limited.proxy.set_delay(0.0)
    return limited


def post(url: str, data: bytes, chunked: bool = False) -> tuple[int, dict[str, str], Any]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if chunked:  # no Content-Length: the server can only find out by reading
            body: Any = (data[i : i + 8192] for i in range(0, len(data), 8192))
            conn.request("POST", "/v1/completions", body, headers, encode_chunked=True)
        else:
            conn.request("POST", "/v1/completions", data, headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError:
            payload = raw.decode(errors="replace")
        return resp.status, dict(resp.headers), payload
    finally:
        conn.close()


def complete(url: str, **body: Any) -> tuple[int, Any]:
    return http_json(f"{url}/v1/completions", {"temperature": 0, **body}, timeout=120)


def target_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def requests_with_status(url: str, status: str) -> float:
    return target_samples(url).get(("starsd_target_requests_total", (("status", status),)), 0.0)


def active_requests(url: str) -> float:
    return target_samples(url)[("starsd_target_active_requests", ())]


# --- body size ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_refused_with_413(plain_link: Limited, chunked: bool) -> None:
    big = json.dumps({"prompt": "x", "max_tokens": 4, "user": "u" * (MAX_BODY + 100)}).encode()
    status, _, payload = post(plain_link.url, big, chunked=chunked)
    assert status == 413
    assert f"{MAX_BODY} bytes" in payload["error"]["message"]
    # Just under the limit (an ignored field pads it): size alone decides.
    fits = json.dumps({"prompt": "x", "max_tokens": 4, "temperature": 0, "user": "u" * (MAX_BODY - 200)}).encode()
    assert len(fits) <= MAX_BODY
    status, _, payload = post(plain_link.url, fits, chunked=chunked)
    assert status == 200, payload


# --- max_tokens and the context -------------------------------------------------------------------------


def test_max_tokens_over_the_cap_is_refused_and_the_cap_itself_is_served(
    plain_link: Limited, oracle: Reference
) -> None:
    status, body = complete(plain_link.url, prompt="def f(", max_tokens=TOKENS_CAP + 1)
    assert status == 400
    assert body["error"]["param"] == "max_tokens" and f"limit of {TOKENS_CAP}" in body["error"]["message"]
    status, body = complete(plain_link.url, prompt="def f(", max_tokens=TOKENS_CAP)
    assert status == 200
    assert body["starsd"]["token_ids"] == oracle.greedy("def f(", TOKENS_CAP)


def test_a_prompt_filling_the_context_is_served_and_one_token_more_is_refused(
    plain_link: Limited, oracle: Reference
) -> None:
    context = oracle.model.max_context
    vocab = oracle.model.vocab_size
    room = 8
    prompt = [2 + (i * 37) % (vocab - 2) for i in range(context - room)]
    status, body = complete(plain_link.url, prompt=prompt, max_tokens=room + 1)
    assert status == 400
    assert body["error"]["code"] == "context_length_exceeded" and str(context) in body["error"]["message"]
    status, body = complete(plain_link.url, prompt=prompt, max_tokens=room)  # exactly the context
    assert status == 200, body
    assert body["starsd"]["token_ids"] == oracle.greedy(prompt, room)
    status, body = complete(plain_link.url, prompt=[*prompt, *prompt], max_tokens=1)  # the prompt alone is over
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


# --- concurrency --------------------------------------------------------------------------------------


def test_a_second_completion_on_a_full_target_gets_429_with_retry_after(limited: Limited, oracle: Reference) -> None:
    url = limited.url
    prompt = long_greedy_prompts(oracle, 1, TOKENS_CAP)[0]
    refused_before = requests_with_status(url, "429")
    limited.proxy.set_delay(0.3)  # each round waits >= 0.6 s for its proposal: the held completion takes seconds
    held = HeldStream(url, prompt, TOKENS_CAP)
    try:
        assert held.status == 200 and held.first
        for stream in (False, True):
            status, headers, payload = post(
                url, json.dumps({"prompt": "x", "max_tokens": 4, "stream": stream}).encode()
            )
            assert status == 429, payload
            assert int(headers["Retry-After"]) >= 1
            assert payload["error"]["type"] == "rate_limit_error" and payload["error"]["code"] == "rate_limit_exceeded"
        done, ids = held.finish()  # the held completion was not disturbed by the refusals
    finally:
        held.close()
        limited.proxy.set_delay(0.0)
    assert done and ids == oracle.greedy(prompt, TOKENS_CAP)
    assert requests_with_status(url, "429") - refused_before == 2
    status, body = complete(url, prompt="def f(", max_tokens=8)  # the slot is free again
    assert status == 200 and body["starsd"]["token_ids"] == oracle.greedy("def f(", 8)


def test_a_client_that_hangs_up_mid_stream_frees_its_slot_and_its_draft_session(
    limited: Limited, oracle: Reference
) -> None:
    url = limited.url
    prompt = long_greedy_prompts(oracle, 1, TOKENS_CAP)[0]
    closed_before = requests_with_status(url, "client_closed")
    limited.proxy.set_delay(0.3)
    try:
        held = HeldStream(url, prompt, TOKENS_CAP)
        assert held.status == 200 and held.first
        held.close()  # hang up: the target must notice, stop generating and free the slot
        wait_for(lambda: active_requests(url) == 0, 60, "the target to free the slot of a client that hung up")
    finally:
        limited.proxy.set_delay(0.0)
    assert requests_with_status(url, "client_closed") - closed_before == 1  # stopped, not run to its end
    wait_sessions_freed(limited.star.star)
    status, _ = complete(url, prompt="def f(", max_tokens=4)
    assert status == 200


# --- gRPC message size ------------------------------------------------------------------------------------


def test_a_grpc_message_over_4_mib_is_refused_and_the_draft_keeps_serving(
    plain_link: Limited, oracle: Reference
) -> None:
    star = plain_link.star.star
    served_before = draft_metrics(star).get("starsd_draft_requests_total", 0.0)
    huge = pb.ProposeRequest(
        target_id="probe", session_id=1, seq=1, gamma=2, top_p=1.0, tokens=[1000] * 2_200_000
    )  # 2-byte varints: about 4.4 MB
    assert huge.ByteSize() > 4 * 1024 * 1024
    with grpc.insecure_channel(star.draft_address) as channel:
        stub = pb_grpc.DraftStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Propose(iter([huge]), timeout=60))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The same draft, a sane request on a new stream: served.
        small = pb.ProposeRequest(target_id="probe", session_id=2, seq=1, gamma=2, top_p=1.0, tokens=[5, 6, 7])
        answers = list(stub.Propose(iter([small]), timeout=60))
        assert answers[0].error_code == 0 and len(answers[0].token_ids) == 2
    assert draft_metrics(star)["starsd_draft_requests_total"] >= served_before + 1
    for url in plain_link.star.urls:  # and the star's targets still draft
        status, body = complete(url, prompt="def f(", max_tokens=16)
        assert status == 200 and body["starsd"]["drafted_tokens"] > 0
        assert body["starsd"]["token_ids"] == oracle.greedy("def f(", 16)


# --- input the model's tokenizer can not take -------------------------------------------------------------


def test_a_prompt_with_an_unpaired_surrogate_gets_400_not_500(plain_link: Limited) -> None:
    # Valid JSON ("\ud800" escapes), but not text: the real tokenizer raises on it.
    status, _, payload = post(plain_link.url, b'{"prompt": "def f(\\ud800):", "max_tokens": 4}')
    assert status == 400 and payload["error"]["param"] == "prompt", payload
    status, _ = complete(plain_link.url, prompt="def f():", max_tokens=4)
    assert status == 200
