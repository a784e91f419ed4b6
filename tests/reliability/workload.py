"""A bounded, seeded client workload against targets' /v1/completions, and the figures it reports.

Each of ``clients`` concurrent clients sends one request after another until the time or the request budget is
spent; every request's outcome is kept (status, latency, token ids, the ``starsd`` stats), so a test can check
each one against the oracle afterwards. Streaming and non-streaming, greedy and sampled requests are mixed.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from starsd.paths import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"


@dataclass(frozen=True)
class Workload:
    urls: Sequence[str]
    prompts: Sequence[str | list[int]]
    clients: int = 16
    duration: float = 15.0  # seconds during which new requests start
    max_requests: int = 2000  # and at most this many in all
    max_tokens: Sequence[int] = (8, 24, 48)
    sampled_fraction: float = 0.2  # requests with temperature > 0 (their output is checked for shape only)
    stream_fraction: float = 0.3  # requests with stream=true
    request_timeout: float = 180.0
    think: float = 0.0  # each client waits up to this long (uniformly drawn) between requests
    seed: int = 0
    until: threading.Event | None = None  # set it to stop starting requests before ``duration`` is over


@dataclass
class Outcome:
    url: str
    prompt: str | list[int]
    max_tokens: int
    greedy: bool
    stream: bool
    started: float  # monotonic
    latency: float = 0.0  # seconds to the full answer (streams: to [DONE])
    first_event: float | None = None  # streams: seconds to the first event
    status: int | None = None  # None: no HTTP answer at all
    error: str = ""
    retry_after: str | None = None
    token_ids: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)  # the completion's "starsd" object

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


async def _complete(session: aiohttp.ClientSession, out: Outcome, body: dict[str, Any], timeout: float) -> None:
    start = time.monotonic()
    try:
        async with session.post(
            f"{out.url}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            out.status = resp.status
            out.retry_after = resp.headers.get("Retry-After")
            if resp.status != 200:
                out.error = (await resp.text())[:300]
            elif not out.stream:
                payload = await resp.json()
                out.stats = payload["starsd"]
                out.token_ids = list(out.stats["token_ids"])
            else:
                done = False
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    if out.first_event is None:
                        out.first_event = time.monotonic() - start
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "starsd" in event:
                        out.stats = event["starsd"]
                        out.token_ids = list(out.stats["token_ids"])
                if not done:
                    out.error = "the stream ended without [DONE]"
                elif not out.stats:
                    out.error = "the stream carried no usage"
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, KeyError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.latency = time.monotonic() - start


async def run_async(work: Workload) -> list[Outcome]:
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + work.duration
    budget = [work.max_requests]

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(work.seed * 1_000_003 + index)
        while time.monotonic() < deadline and budget[0] > 0 and not (work.until and work.until.is_set()):
            budget[0] -= 1
            greedy = rng.random() >= work.sampled_fraction
            out = Outcome(
                url=work.urls[(index + len(outcomes)) % len(work.urls)],
                prompt=rng.choice(list(work.prompts)),
                max_tokens=rng.choice(list(work.max_tokens)),
                greedy=greedy,
                stream=rng.random() < work.stream_fraction,
                started=time.monotonic(),
            )
            body: dict[str, Any] = {
                "prompt": out.prompt,
                "max_tokens": out.max_tokens,
                "temperature": 0.0 if greedy else 0.8,
                "stream": out.stream,
            }
            if out.stream:
                body["stream_options"] = {"include_usage": True}
            if not greedy:
                body["seed"] = rng.randrange(2**31)
            outcomes.append(out)
            await _complete(session, out, body, work.request_timeout)
            if work.think > 0:
                await asyncio.sleep(rng.uniform(0, work.think))

    connector = aiohttp.TCPConnector(limit=work.clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(i, session) for i in range(work.clients)))
    return outcomes


def run(work: Workload) -> list[Outcome]:
    """Run the workload to its end (call it from a worker thread to inject faults meanwhile)."""
    return asyncio.run(run_async(work))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarize(outcomes: Sequence[Outcome], wall_seconds: float, **extra: Any) -> dict[str, Any]:
    """The figures of a run: counts, latency percentiles, tokens, and whatever the test adds (faults, memory)."""
    ok = [o for o in outcomes if o.ok]
    latencies = [o.latency for o in ok]
    first = [o.first_event for o in ok if o.first_event is not None]
    statuses: dict[str, int] = {}
    for o in outcomes:
        key = str(o.status) if o.status is not None else "no-answer"
        statuses[key] = statuses.get(key, 0) + 1
    tokens = sum(len(o.token_ids) for o in ok)

    def total(name: str) -> int:
        return sum(int(o.stats.get(name, 0)) for o in ok)

    return {
        "requests_sent": len(outcomes),
        "completed": len(ok),
        "failed": len(outcomes) - len(ok),
        "statuses": statuses,
        "greedy_checked": sum(1 for o in ok if o.greedy),
        "streamed": sum(1 for o in outcomes if o.stream),
        "latency_p50_s": round(percentile(latencies, 50), 4),
        "latency_p99_s": round(percentile(latencies, 99), 4),
        "latency_max_s": round(max(latencies, default=0.0), 4),
        "first_event_p50_s": round(percentile(first, 50), 4),
        "first_event_p99_s": round(percentile(first, 99), 4),
        "wall_seconds": round(wall_seconds, 2),
        "completion_tokens": tokens,
        "tokens_per_second": round(tokens / wall_seconds, 1) if wall_seconds > 0 else 0.0,
        "drafted_tokens": total("drafted_tokens"),
        "accepted_tokens": total("accepted_tokens"),
        "fallback_tokens": total("fallback_tokens"),
        **extra,
    }


def report(name: str, figures: dict[str, Any]) -> Path:
    """Print the figures and write them to bench/results/reliability-<name>.json (git-ignored)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"reliability-{name}.json"
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"\n[reliability:{name}] " + json.dumps(figures, sort_keys=True))
    return path


def failures(outcomes: Sequence[Outcome], limit: int = 5) -> str:
    """A readable digest of the failed requests, for assertion messages."""
    bad = [o for o in outcomes if not o.ok]
    lines = [f"{o.url} status={o.status} error={o.error[:200]!r} prompt={o.prompt!r}" for o in bad[:limit]]
    return f"{len(bad)} failed of {len(outcomes)}:\n" + "\n".join(lines)


def as_json(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [asdict(o) for o in outcomes]


class HeldStream:
    """A streaming completion read up to its first event, then held open."""

    def __init__(self, url: str, prompt: str | list[int], max_tokens: int) -> None:
        host, _, port = url.removeprefix("http://").rpartition(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.first = b""
        while self.status == 200 and not self.first.startswith(b"data: "):
            self.first = self.response.readline()
            if not self.first:
                break

    def finish(self) -> tuple[bool, list[int]]:
        """Read to the end: (saw [DONE], the token ids of the usage event)."""
        done, ids = False, list[int]()
        try:
            for raw in self.response:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    ids = event.get("starsd", {}).get("token_ids", ids)
        except (OSError, http.client.HTTPException):
            pass
        self.conn.close()
        return done, ids

    def close(self) -> None:
        self.conn.close()
