"""Protocol overhead of one round on loopback: round trip minus the draft's model time, and bytes per round.

One emulated target (the product's target engine and draft link with no verify time, :mod:`starsd.bench.emulated`)
talks to a real draft server on a real checkpoint, so sampled proposals carry their exact top-k distributions.
Each round's overhead is its round trip with the draft's reported service time taken out. Bytes per round count
both messages as they travel: the protobuf payload inside its one-request ``ProposeBurst`` (or reply), gRPC's
5-byte message prefix and HTTP/2's 9-byte DATA frame header each way.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from starsd.bench.emulated import EmulatedTarget, TargetSpec
from starsd.bench.harness import CONNECT_SECONDS, DraftEndpoint, local_draft
from starsd.bench.report import Column, Machine, percentile, table

FRAMING_BYTES = 5 + 9  # gRPC length prefix + HTTP/2 DATA frame header, per message


def on_the_wire(payload: int) -> int:
    """A request's (or answer's) bytes as it travels alone in a burst message: the burst's field tag and the
    payload's length (a varint), then the message's framing."""
    length_bytes = max(1, (payload.bit_length() + 6) // 7)
    return payload + 1 + length_bytes + FRAMING_BYTES


@dataclass(frozen=True)
class ProtocolResult:
    mode: str  # greedy | sampled
    gamma: int
    rounds: int
    overhead_p50_ms: float
    overhead_p99_ms: float
    rtt_p50_ms: float
    service_p50_ms: float
    request_bytes: float  # mean per round, framing included
    response_bytes: float
    bytes_per_round: float


async def measure(
    endpoint: DraftEndpoint, gamma: int, temperature: float, rounds: int, warmup: int = 20
) -> ProtocolResult:
    """``rounds`` rounds of one target (after ``warmup``), each accepting about half of its drafts."""
    vocab = int(endpoint.info.vocab_size)
    spec = TargetSpec(gamma, (0.7,) * gamma, 0.0, 0.0, vocab, session_tokens=128, temperature=temperature)
    target = EmulatedTarget("bench", endpoint.address, endpoint.info, spec, seed=7)
    await target.connect(CONNECT_SECONDS)
    stop = asyncio.Event()
    running = asyncio.create_task(target.run(stop))
    while len(target.run_record.rounds) < warmup + rounds and not running.done():
        await asyncio.sleep(0.01)
    stop.set()
    record = await running
    if record.error:
        raise RuntimeError(f"the benchmark's target failed: {record.error}")
    measured = record.rounds[warmup : warmup + rounds]
    overheads = [r.received - r.sent - r.service for r in measured]
    rtts = [r.received - r.sent for r in measured]
    services = [r.service for r in measured]
    req_bytes = [on_the_wire(r.request_bytes) for r in measured]
    resp_bytes = [on_the_wire(r.response_bytes) for r in measured]
    mean_req, mean_resp = statistics.fmean(req_bytes), statistics.fmean(resp_bytes)
    return ProtocolResult(
        mode="greedy" if temperature == 0 else "sampled",
        gamma=gamma,
        rounds=len(measured),
        overhead_p50_ms=percentile(overheads, 0.5) * 1e3,
        overhead_p99_ms=percentile(overheads, 0.99) * 1e3,
        rtt_p50_ms=percentile(rtts, 0.5) * 1e3,
        service_p50_ms=percentile(services, 0.5) * 1e3,
        request_bytes=mean_req,
        response_bytes=mean_resp,
        bytes_per_round=mean_req + mean_resp,
    )


async def run_async(draft_model: Path, gamma: int = 4, rounds: int = 500) -> list[ProtocolResult]:
    """Start a real draft process on loopback and measure greedy and sampled rounds against it."""
    async with local_draft(draft_model) as endpoint:
        return [await measure(endpoint, gamma, temperature, rounds) for temperature in (0.0, 1.0)]


def run(draft_model: Path, gamma: int = 4, rounds: int = 500) -> list[ProtocolResult]:
    return asyncio.run(run_async(draft_model, gamma, rounds))


COLUMNS: list[Column[ProtocolResult]] = [
    Column("mode", lambda r: r.mode, "", 8, left=True),
    Column("gamma", lambda r: r.gamma, "d", 6),
    Column("overhead p50", lambda r: r.overhead_p50_ms, ".3f", 14, unit="ms"),
    Column("p99", lambda r: r.overhead_p99_ms, ".3f", 9, unit="ms"),
    Column("rtt p50", lambda r: r.rtt_p50_ms, ".3f", 10, unit="ms"),
    Column("model p50", lambda r: r.service_p50_ms, ".3f", 11, unit="ms"),
    Column("bytes/round", lambda r: r.bytes_per_round, ".0f", 13),
]


@dataclass
class ProtocolReport:
    """``starsd bench protocol``'s report: one result per mode (greedy, sampled)."""

    benchmark: str = field(default="protocol", init=False)
    draft_model: str
    machine: Machine
    results: list[ProtocolResult]

    def table(self) -> str:
        return "\n".join(table(self.results, COLUMNS))
