"""``starsd bench serve``: drive any OpenAI-compatible completions endpoint at a fixed concurrency.

The metric names are the ones serving benchmarks use (vLLM's ``bench serve``, GuideLLM, AIPerf): output
tokens/s, TTFT (time to first token), TPOT (time per output token after the first), ITL (inter-token
latency: the gaps between streamed chunks, per token) and E2E (end-to-end request latency), with percentiles.
Every request streams (``stream: true``, usage in the last chunk), so TTFT is what a client sees.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class ServeConfig:
    urls: tuple[str, ...]  # base URLs (http://host:port); requests go round-robin
    concurrency: int = 16  # requests in flight at once (per run, over all URLs)
    requests: int = 64
    prompt_tokens: int = 32  # random token-id prompts of this length
    max_tokens: int = 64
    temperature: float = 0.0
    ignore_eos: bool = True  # every request generates max_tokens, as benchmarks of serving do
    vocab: tuple[int, int] = (3, 2000)  # prompt ids are drawn from [lo, hi)
    seed: int = 0
    model: str | None = None
    warmup: int = 2  # requests sent (and not counted) before the timed run


@dataclass
class RequestRecord:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    # Gaps between streamed chunks after the first (as vLLM's bench reports ITL: with speculative decoding a
    # chunk may carry several tokens, so TPOT is the per-token figure).
    itl: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """``{"mean", "p50", ...}`` of ``values`` (nearest-rank percentiles; zeros when empty)."""
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in points}}
    ordered = sorted(values)
    out = {"mean": statistics.fmean(ordered)}
    for p in points:
        rank = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
        out[f"p{p}"] = ordered[rank]
    return out


def summarize(config: ServeConfig, records: Sequence[RequestRecord], wall: float) -> dict[str, Any]:
    """The run's figures, in the units serving benchmarks report (seconds, tokens/s)."""
    done = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in done)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    drafted = sum(r.drafted for r in done)
    return {
        "config": {**asdict(config), "urls": list(config.urls)},
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": sorted({r.error for r in records if not r.ok})[:5],
        "duration_s": wall,
        "request_throughput": len(done) / wall if wall else 0.0,
        "output_tokens": output,
        "output_throughput": output / wall if wall else 0.0,
        "total_token_throughput": (output + sum(r.prompt_tokens for r in done)) / wall if wall else 0.0,
        "ttft_s": percentiles([r.ttft for r in done]),
        "tpot_s": percentiles(tpot),
        "itl_s": percentiles([gap for r in done for gap in r.itl]),
        "e2e_latency_s": percentiles([r.e2e for r in done]),
        "acceptance": (sum(r.accepted for r in done) / drafted) if drafted else None,
    }


def _prompts(config: ServeConfig, n: int) -> list[list[int]]:
    rng = random.Random(config.seed)
    lo, hi = config.vocab
    return [[rng.randrange(lo, hi) for _ in range(config.prompt_tokens)] for _ in range(n)]


async def _one(session: aiohttp.ClientSession, url: str, config: ServeConfig, prompt: list[int]) -> RequestRecord:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.model:
        body["model"] = config.model
    record = RequestRecord(prompt_tokens=len(prompt))
    start = time.perf_counter()
    last = start
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                record.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return record
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    record.error = str(event["error"].get("message", event["error"]))
                    return record
                now = time.perf_counter()
                text = "".join(c.get("text", "") for c in event.get("choices", []))
                usage = event.get("usage")
                if usage:
                    record.output_tokens = int(usage.get("completion_tokens", 0))
                    extra = event.get("starsd") or {}
                    record.drafted = int(extra.get("drafted_tokens", 0))
                    record.accepted = int(extra.get("accepted_tokens", 0))
                if text:
                    if record.ttft == 0.0:
                        record.ttft = now - start
                    else:
                        record.itl.append(now - last)
                    last = now
    except (aiohttp.ClientError, TimeoutError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.e2e = time.perf_counter() - start
    if record.ttft == 0.0:
        record.ttft = record.e2e
    record.ok = record.output_tokens > 0
    if not record.ok:
        record.error = "no usage in the stream"
    return record


async def run_async(config: ServeConfig) -> dict[str, Any]:
    prompts = _prompts(config, config.requests + config.warmup)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for i in range(config.warmup):
            await _one(session, config.urls[i % len(config.urls)], config, prompts[config.requests + i])
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(config.requests):
            queue.put_nowait(i)
        records: list[RequestRecord] = [RequestRecord() for _ in range(config.requests)]

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                records[i] = await _one(session, config.urls[i % len(config.urls)], config, prompts[i])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(config.concurrency, config.requests))))
        wall = time.perf_counter() - start
    return summarize(config, records, wall)


def run(config: ServeConfig) -> dict[str, Any]:
    return asyncio.run(run_async(config))


def format_summary(result: dict[str, Any]) -> str:
    cfg = result["config"]
    ms = 1000.0

    def row(name: str, key: str) -> str:
        v = result[key]
        return f"{name:<10}{v['mean'] * ms:9.1f}{v['p50'] * ms:9.1f}{v['p90'] * ms:9.1f}{v['p99'] * ms:9.1f}"

    acceptance = result["acceptance"]
    lines = [
        f"{result['completed']} completions ({result['failed']} failed) at concurrency {cfg['concurrency']}, "
        f"{cfg['prompt_tokens']} prompt / {cfg['max_tokens']} output tokens, in {result['duration_s']:.1f} s",
        f"output tokens/s {result['output_throughput']:.1f}   requests/s {result['request_throughput']:.2f}"
        + (f"   acceptance {acceptance:.2f}" if acceptance is not None else ""),
        f"{'ms':<10}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}",
        row("TTFT", "ttft_s"),
        row("TPOT", "tpot_s"),
        row("ITL", "itl_s"),
        row("E2E", "e2e_latency_s"),
    ]
    if result["errors"]:
        lines.append("errors: " + "; ".join(result["errors"]))
    return "\n".join(lines)
