"""API keys on a real target, through the official ``openai`` client: the right key is served (plain and
streamed), no key and a wrong key get 401 in OpenAI's shape, the probes and /metrics stay open, refusals are
counted, and no key reaches any log line of the run."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from starsd.local import LocalStar, http_json
from tests.integration.conftest import start_star

KEY = "sk-starsd-test-4f1d2c3b5a69788796a5b4c3d2e1f0aa"
SECOND = "sk-starsd-rotated-0e1d2c3b4a5968778695a4b3c2d1e0ff"
WRONG = "sk-starsd-wrong-aa11bb22cc33dd44ee55ff6677889900"
PROMPT = "def __init__(self"
ERROR_SHAPE = {"type": "invalid_request_error", "param": None, "code": "invalid_api_key"}


@pytest.fixture(scope="module")
def star(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    """One draft, one target that accepts two keys; every process logs at DEBUG, so the log check below sees
    everything the servers could write."""
    star = start_star(shipped_pair, 1, tmp_path_factory.mktemp("keys"), api_keys=(KEY, SECOND), log_level="DEBUG")
    try:
        yield star
    finally:
        star.stop()


def client(star: LocalStar, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{star.urls[0]}/v1", api_key=key, max_retries=0, timeout=120)


def unauthorized(star: LocalStar) -> dict[str, float]:
    text = urllib.request.urlopen(f"{star.urls[0]}/metrics", timeout=30).read().decode()
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "starsd_target_unauthorized_requests"
        for s in family.samples
        if s.name.endswith("_total")
    }


def test_the_right_key_is_served_plain_and_streamed(star: LocalStar) -> None:
    for key in (KEY, SECOND):
        api = client(star, key)
        model = api.models.list().data[0].id
        out = api.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
        assert out.usage is not None and out.usage.completion_tokens > 0
        chunks = list(api.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
    chat = client(star, KEY).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    assert any(c.choices and c.choices[0].delta.content for c in chat)


@pytest.mark.parametrize("who", ["no key", "wrong key"])
def test_no_key_and_a_wrong_key_get_401_in_openais_shape(star: LocalStar, who: str) -> None:
    api = client(star, WRONG)
    # No key: the client sends no Authorization header at all (openai's explicit omission).
    extra = {"Authorization": openai.Omit()} if who == "no key" else {}
    before = unauthorized(star)
    reason = "missing" if who == "no key" else "invalid"
    messages = [{"role": "user", "content": "hi"}]
    calls = [
        lambda: api.models.list(extra_headers=extra),  # type: ignore[arg-type]
        lambda: api.completions.create(model="x", prompt=PROMPT, max_tokens=4, extra_headers=extra),  # type: ignore[arg-type]
        lambda: api.completions.create(model="x", prompt=PROMPT, max_tokens=4, stream=True, extra_headers=extra),  # type: ignore[arg-type]
        lambda: api.chat.completions.create(model="x", messages=messages, stream=True, extra_headers=extra),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(openai.AuthenticationError) as caught:
            call()
        assert caught.value.status_code == 401
        assert isinstance(caught.value.body, dict)
        assert {k: caught.value.body[k] for k in ERROR_SHAPE} == ERROR_SHAPE
        assert isinstance(caught.value.body["message"], str) and caught.value.body["message"]
        assert WRONG not in caught.value.body["message"]
    after = unauthorized(star)
    assert after[reason] - before.get(reason, 0.0) == len(calls)


def test_probes_metrics_and_version_need_no_key_and_the_rest_does(star: LocalStar) -> None:
    url = star.urls[0]
    for path in ("/health", "/healthz", "/readyz", "/version", "/metrics"):
        with urllib.request.urlopen(f"{url}{path}", timeout=30) as answer:
            assert answer.status == 200, path
    assert http_json(f"{url}/tokenize", {"prompt": "hi"})[0] == 401
    assert http_json(f"{url}/no/such/route")[0] == 401


def test_no_key_reaches_any_log_line_of_the_run(star: LocalStar) -> None:
    # Traffic first: served, refused and streamed requests, with the right and a wrong key.
    api = client(star, KEY)
    model = api.models.list().data[0].id
    list(api.completions.create(model=model, prompt=PROMPT, max_tokens=4, stream=True))
    with pytest.raises(openai.AuthenticationError):
        client(star, WRONG).completions.create(model=model, prompt=PROMPT, max_tokens=4)
    star.stop()  # the shutdown lines too
    assert star.log_dir is not None
    logs = {path.name: path.read_text() for path in sorted(star.log_dir.glob("*.log"))}
    assert set(logs) == {"draft.log", "target-0.log"}
    target_log = logs["target-0.log"]
    assert "serving model" in target_log and "DEBUG" in target_log  # the capture holds the run, verbosely
    assert "needs one of 2 API keys" in target_log
    for name, text in logs.items():
        for line in text.splitlines():
            for secret in (KEY, SECOND, WRONG):
                assert secret not in line, f"{name}: a key in the log"
