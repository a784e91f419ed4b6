"""How the target admits a completion, pinned on the HTTP app with a stand-in engine (no model, no processes).

Encoding a prompt costs time proportional to its size (a 1 MiB prompt takes about a second with a fast
tokenizer): done on the event loop, it would stall every other completion on the target for that long, and a full
target would spend it on requests it then refuses with 429.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from starsd.devices import resolve
from starsd.openai_api.app import TargetApp, TargetServerOptions
from starsd.sampling import SamplingParams
from starsd.verifier.engine import GenerationStats, StopCheck
from starsd.verifier.metrics import TargetMetrics
from starsd.verifier.scheduler import KvBudget


class RecordingTokenizer:
    """Counts encodes and notes the thread each ran on."""

    def __init__(self) -> None:
        self.encode_threads: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.encode_threads.append(threading.get_ident())
        return [3] * min(len(text), 8)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "x" * len(ids)


class GatedEngine:
    """Generates one token per round, each round waiting for ``gate`` (so a test can hold a completion)."""

    def __init__(self) -> None:
        self.loaded = SimpleNamespace(
            vocab_size=100,
            max_context=4096,
            tokenizer=RecordingTokenizer(),
            eos_token_id=None,
            name="fake",
            placement=resolve("cpu", "float32"),
        )
        self.budget = KvBudget(max_num_seqs=64, kv_tokens=1 << 20)
        self.draft = None
        self.metrics = TargetMetrics()
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    def reservation(self, prompt_tokens: int, max_tokens: int) -> int:
        return prompt_tokens + max_tokens

    async def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        params: SamplingParams,
        stats: GenerationStats,
        stop: StopCheck | None = None,
        ignore_eos: bool = False,
        controls: object = None,
    ) -> AsyncIterator[list[int]]:
        self.started.set()
        for _ in range(max_tokens):
            await self.gate.wait()
            if stop is not None:  # the engine's contract: every round's tokens go through the stop check
                stop(stats.token_ids, [5])
            stats.rounds += 1
            stats.generated_tokens += 1
            stats.token_ids.append(5)
            yield [5]


async def _serve(engine: GatedEngine, max_concurrency: int = 4) -> TestClient[Any, Any]:
    app = TargetApp(engine, TargetServerOptions(target_id="t", served_model="fake", max_concurrency=max_concurrency))  # type: ignore[arg-type]
    client: TestClient[Any, Any] = TestClient(TestServer(app.build()))
    await client.start_server()
    return client


def test_prompts_are_encoded_off_the_event_loop() -> None:
    async def main() -> None:
        engine = GatedEngine()
        engine.gate.set()
        client = await _serve(engine)
        try:
            resp = await client.post("/v1/completions", json={"prompt": "def f(", "max_tokens": 2})
            assert resp.status == 200, await resp.text()
        finally:
            await client.close()
        tokenizer = engine.loaded.tokenizer
        assert tokenizer.encode_threads, "the prompt was not encoded"
        assert threading.get_ident() not in tokenizer.encode_threads  # the loop's thread stayed free

    asyncio.run(main())


def test_a_full_target_refuses_with_429_before_spending_anything_on_the_request() -> None:
    async def main() -> None:
        engine = GatedEngine()
        client = await _serve(engine, max_concurrency=1)
        try:
            held = asyncio.create_task(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}))
            await asyncio.wait_for(engine.started.wait(), 10)  # the one slot is taken
            encodes = len(engine.loaded.tokenizer.encode_threads)
            resp = await client.post("/v1/completions", json={"prompt": "b" * 100_000, "max_tokens": 2})
            assert resp.status == 429 and resp.headers["Retry-After"] == "1"
            assert (await resp.json())["error"]["type"] == "rate_limit_error"
            assert len(engine.loaded.tokenizer.encode_threads) == encodes  # not encoded, only refused
            engine.gate.set()
            first = await asyncio.wait_for(held, 10)
            assert first.status == 200
            again = await client.post("/v1/completions", json={"prompt": "c", "max_tokens": 2})
            assert again.status == 200  # the slot was given back
        finally:
            await client.close()

    asyncio.run(main())


def test_a_request_refused_as_bad_gives_its_slot_back() -> None:
    async def main() -> None:
        engine = GatedEngine()
        engine.gate.set()
        client = await _serve(engine, max_concurrency=1)
        try:
            for body in ({"prompt": "x", "max_tokens": -1}, {"prompt": [10**6]}, {"prompt": ""}):
                resp = await client.post("/v1/completions", json=body)
                assert resp.status == 400
            bad_json = await client.post("/v1/completions", data=b"{", headers={"Content-Type": "application/json"})
            assert bad_json.status == 400
            ok = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            assert ok.status == 200
        finally:
            await client.close()

    asyncio.run(main())


class FailingEngine(GatedEngine):
    """Generates ``good`` rounds, then fails as a bug in the generation loop would."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self.gate.set()
        self.good = good

    async def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        params: SamplingParams,
        stats: GenerationStats,
        stop: StopCheck | None = None,
        ignore_eos: bool = False,
        controls: object = None,
    ) -> AsyncIterator[list[int]]:
        for _ in range(self.good):
            if stop is not None:
                stop(stats.token_ids, [5])
            stats.generated_tokens += 1
            stats.token_ids.append(5)
            yield [5]
        raise RuntimeError("a bug in the generation loop")


@pytest.mark.parametrize("good", [0, 2])
def test_an_internal_error_answers_in_the_openai_error_shape_and_the_server_keeps_serving(good: int) -> None:
    async def main() -> None:
        client = await _serve(FailingEngine(good))
        try:
            resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
            assert resp.status == 500
            assert resp.content_type == "application/json"
            error = (await resp.json())["error"]
            assert error["type"] == "server_error" and error["code"] == "internal_error"
            assert "a bug in the generation loop" in error["message"] and "param" in error
            streamed = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True})
            assert streamed.status == 200  # the headers went out before the failure
            events = [line[6:] for line in (await streamed.text()).splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert json.loads(events[-2])["error"]["code"] == "internal_error"
            assert len(events) == good + 2  # every chunk before the failure, the error, [DONE]
            health = await client.get("/healthz")
            assert health.status == 200
        finally:
            await client.close()

    asyncio.run(main())
