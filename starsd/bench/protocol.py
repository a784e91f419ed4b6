"""Protocol overhead of one round on loopback: round trip minus the draft's model time, and bytes per round.

One target stream talks to a real draft server (a real checkpoint, so sampled proposals carry their exact
top-k distributions); each round sends the tokens a target would commit and measures the round trip with the
draft's reported service time taken out. Bytes per round count both messages as they travel: the protobuf
payload, gRPC's 5-byte message prefix and HTTP/2's 9-byte DATA frame header each way.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from starsd.bench.analysis import percentile
from starsd.bench.harness import local_draft
from starsd.bench.report import Column, Machine, table
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

FRAMING_BYTES = 5 + 9  # gRPC length prefix + HTTP/2 DATA frame header, per message


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


async def measure(address: str, gamma: int, temperature: float, rounds: int, warmup: int = 20) -> ProtocolResult:
    queue: asyncio.Queue[pb.ProposeRequest] = asyncio.Queue()

    async def requests() -> AsyncIterator[pb.ProposeRequest]:
        while True:
            yield await queue.get()

    overheads: list[float] = []
    rtts: list[float] = []
    services: list[float] = []
    req_bytes: list[int] = []
    resp_bytes: list[int] = []
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.DraftStub(channel).Propose(requests())
        prompt = [11, 12, 13, 14, 15, 16, 17, 18]
        session_rounds = 32  # a fresh session now and then keeps contexts short, as in real traffic
        tokens: list[int] = []
        for i in range(rounds + warmup):
            session, seq = 1 + i // session_rounds, 1 + i % session_rounds
            if seq == 1:
                tokens = prompt
            req = pb.ProposeRequest(
                target_id="bench",
                session_id=session,
                seq=seq,
                tokens=tokens,
                gamma=gamma,
                sample=temperature > 0,
                temperature=temperature,
                top_p=1.0,
                top_k=8,
                seed=7,
                verify_seconds=0.003,
                rtt_seconds=rtts[-1] if rtts else 0.0,
            )
            sent = time.perf_counter()
            queue.put_nowait(req)
            resp = await call.read()
            rtt = time.perf_counter() - sent
            if resp is grpc.aio.EOF or resp.error_code or len(resp.token_ids) != gamma:
                raise RuntimeError(f"the draft refused a benchmark request: {getattr(resp, 'error_message', 'EOF')}")
            # A typical round: the target accepted about half the drafts and added one token.
            accepted = list(resp.token_ids[: max(0, gamma // 2)])
            tokens = [*accepted, (resp.token_ids[-1] + 1) % 256 if resp.token_ids else 1]
            if i >= warmup:
                rtts.append(rtt)
                services.append(resp.service_seconds)
                overheads.append(rtt - resp.service_seconds)
                req_bytes.append(req.ByteSize() + FRAMING_BYTES)
                resp_bytes.append(resp.ByteSize() + FRAMING_BYTES)
        call.cancel()
    mean_req, mean_resp = statistics.fmean(req_bytes), statistics.fmean(resp_bytes)
    return ProtocolResult(
        mode="greedy" if temperature == 0 else "sampled",
        gamma=gamma,
        rounds=rounds,
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
    async with local_draft(["--model", str(draft_model)]) as endpoint:
        return [await measure(endpoint.address, gamma, temperature, rounds) for temperature in (0.0, 1.0)]


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
