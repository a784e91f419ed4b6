"""``starsd bench serve``: drive any OpenAI-compatible completions endpoint at a fixed concurrency.

The metric names are the ones serving benchmarks use (vLLM's ``bench serve``, GuideLLM, AIPerf): output
tokens/s, TTFT (time to first token), TPOT (time per output token after the first), ITL (inter-token
latency: the gaps between streamed chunks, per token) and E2E (end-to-end request latency), with percentiles.
Every request streams (``stream: true``, usage in the last chunk), so TTFT is what a client sees.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from starsd.bench.report import Column, percentile, table


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


@dataclass(frozen=True)
class Percentiles:
    """Mean and percentiles of one latency, in seconds (zeros when nothing was measured)."""

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls()
        return cls(statistics.fmean(values), *(percentile(values, q) for q in (0.5, 0.9, 0.99)))


@dataclass(frozen=True)
class ServeResult:
    """One pass of ``starsd bench serve``, in the units serving benchmarks report (seconds, tokens/s)."""

    config: ServeConfig
    completed: int
    failed: int
    errors: list[str]
    duration_s: float
    request_throughput: float
    output_tokens: int
    output_throughput: float
    total_token_throughput: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    e2e_latency_s: Percentiles
    acceptance: float | None

    def table(self) -> str:
        cfg = self.config
        acceptance = f"   acceptance {self.acceptance:.2f}" if self.acceptance is not None else ""
        rows = [("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("ITL", self.itl_s), ("E2E", self.e2e_latency_s)]
        lines = [
            f"{self.completed} completions ({self.failed} failed) at concurrency {cfg.concurrency}, "
            f"{cfg.prompt_tokens} prompt / {cfg.max_tokens} output tokens, in {self.duration_s:.1f} s",
            f"output tokens/s {self.output_throughput:.1f}   requests/s {self.request_throughput:.2f}{acceptance}",
            *table(rows, LATENCY_COLUMNS),
        ]
        if self.errors:
            lines.append("errors: " + "; ".join(self.errors))
        return "\n".join(lines)


LATENCY_COLUMNS: list[Column[tuple[str, Percentiles]]] = [
    Column("ms", lambda r: r[0], "", 10, left=True),
    Column("mean", lambda r: r[1].mean, ".1f", 9, scale=1e3),
    Column("p50", lambda r: r[1].p50, ".1f", 9, scale=1e3),
    Column("p90", lambda r: r[1].p90, ".1f", 9, scale=1e3),
    Column("p99", lambda r: r[1].p99, ".1f", 9, scale=1e3),
]


@dataclass(frozen=True)
class ServeReport:
    client: str  # "builtin" | "aiperf"
    passes: list[ServeResult]


def summarize(config: ServeConfig, records: Sequence[RequestRecord], wall: float) -> ServeResult:
    """The run's figures, in the units serving benchmarks report (seconds, tokens/s)."""
    done = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in done)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    drafted = sum(r.drafted for r in done)
    return ServeResult(
        config=config,
        completed=len(done),
        failed=len(records) - len(done),
        errors=sorted({r.error for r in records if not r.ok})[:5],
        duration_s=wall,
        request_throughput=len(done) / wall if wall else 0.0,
        output_tokens=output,
        output_throughput=output / wall if wall else 0.0,
        total_token_throughput=(output + sum(r.prompt_tokens for r in done)) / wall if wall else 0.0,
        ttft_s=Percentiles.of([r.ttft for r in done]),
        tpot_s=Percentiles.of(tpot),
        itl_s=Percentiles.of([gap for r in done for gap in r.itl]),
        e2e_latency_s=Percentiles.of([r.e2e for r in done]),
        acceptance=(sum(r.accepted for r in done) / drafted) if drafted else None,
    )


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


async def run_async(config: ServeConfig) -> ServeResult:
    prompts = _prompts(config, config.requests + config.warmup)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for i in range(config.warmup):
            await _one(session, config.urls[i % len(config.urls)], config, prompts[config.requests + i])
        slots = asyncio.Semaphore(config.concurrency)

        async def request(i: int) -> RequestRecord:
            async with slots:
                return await _one(session, config.urls[i % len(config.urls)], config, prompts[i])

        start = time.perf_counter()
        records = await asyncio.gather(*(request(i) for i in range(config.requests)))
        wall = time.perf_counter() - start
    return summarize(config, records, wall)


def run(config: ServeConfig) -> ServeResult:
    return asyncio.run(run_async(config))
