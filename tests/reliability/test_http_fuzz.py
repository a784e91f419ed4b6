"""Any bytes posted to /v1/completions get an answer below 500, through the real HTTP app and its middleware.

tests/test_fuzz.py checks parse_completion on decoded JSON values; this covers the step before it, the raw body:
bytes that are not UTF-8, JSON nested deeper than the decoder recurses, integers longer than Python converts.
The app runs with a stand-in engine (no model) on a loopback port, in a thread of its own.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starsd.openai_api.app import TargetApp, TargetServerOptions
from tests.reliability.test_target_admission import GatedEngine


class AppThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="target-app", daemon=True)
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def _start(self) -> None:
        engine = GatedEngine()
        engine.gate.set()
        app = TargetApp(engine, TargetServerOptions(target_id="t", served_model="fake", max_body_bytes=1 << 20))  # type: ignore[arg-type]
        self.runner = app.runner()
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def start(self) -> AppThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def app_port() -> Iterator[int]:
    app = AppThread().start()
    try:
        yield app.port
    finally:
        app.stop()


def post(port: int, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def assert_clear_4xx(status: int, payload: bytes) -> None:
    assert 400 <= status < 500, (status, payload[:300])
    error = json.loads(payload)["error"]
    assert error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,  # nested deeper than the JSON decoder recurses
        b'{"prompt": "x", "max_tokens": ' + b"1" * 5000 + b"}",  # over Python's int-from-string digit limit
        b'{"prompt": "x", "seed": -' + b"9" * 4301 + b"}",
        b"\xff\xfe\x00{",  # not UTF-8
        b"",
        b"NaN",
        b'{"prompt": "x", "max_tokens": 1e400}',
        b'{"prompt": "ab\\ud800cd"}',  # valid JSON, but no text: the tokenizer raises on it
    ],
    ids=["deep-nesting", "long-int", "long-negative-int", "not-utf8", "empty", "nan", "huge-float", "lone-surrogate"],
)
def test_malformed_bodies_get_a_clear_400(app_port: int, body: bytes) -> None:
    status, payload = post(app_port, body)
    assert_clear_4xx(status, payload)
    ok, _ = post(app_port, b'{"prompt": "x", "max_tokens": 2}')
    assert ok == 200  # and the app goes on serving


FIELDS = st.sampled_from(["prompt", "max_tokens", "stop", "stream", "seed", "n"])
json_text = st.recursive(
    st.sampled_from(["null", "true", "1", "-0", "1e999", '"x"', '"\\ud800"', "[]", "{}"]) | st.from_regex(r"-?\d{1,6}"),
    lambda inner: (
        st.builds(lambda xs: "[" + ",".join(xs) + "]", st.lists(inner, max_size=4))
        | st.builds(
            lambda kv: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in kv) + "}",
            st.lists(st.tuples(FIELDS, inner), max_size=4),
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=200) | json_text.map(str.encode))
def test_any_body_is_answered_below_500(app_port: int, body: bytes) -> None:
    status, payload = post(app_port, body)
    assert status < 500, (status, payload[:300])
    if status != 200:
        assert_clear_4xx(status, payload)
