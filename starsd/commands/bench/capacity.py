"""``starsd bench capacity``: the real draft's capacity (requests/s at saturation), one request at a time
against batched (:mod:`starsd.bench.capacity`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from starsd.commands._common import positive_ints
from starsd.commands.bench.common import (
    DEFAULT_DRAFT_MODEL,
    draft_checkpoint,
    error,
    measure_and_publish,
    stderr_line,
)

HELP = "draft capacity (requests/s at saturation) of the real draft, one-at-a-time vs batched"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft-model", type=Path, default=DEFAULT_DRAFT_MODEL, help="draft checkpoint")
    parser.add_argument(
        "--batches", type=positive_ints, default=(1, 8), help="--max-batch values, the first the baseline"
    )
    parser.add_argument("--sessions", type=int, default=32, help="saturating sessions (zero verify time)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per request")
    parser.add_argument(
        "--session-tokens", type=int, default=512, help="tokens per session before it is released (its context)"
    )
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per batch size and pass")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring, per window")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes over the batch sizes (medians)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from starsd.bench.capacity import CapacityPoint, CapacityReport, measure_capacity, summarise_capacity
    from starsd.bench.report import Machine

    draft = draft_checkpoint(args.draft_model, "capacity")
    if draft is None:
        return 2
    if min(args.sessions, args.gamma, args.session_tokens, args.repeats) < 1 or args.duration <= 0 or args.warmup < 0:
        return error("--sessions, --gamma, --session-tokens, --repeats >= 1, --duration > 0, --warmup >= 0", "capacity")

    def measure() -> list[CapacityPoint]:
        return asyncio.run(
            measure_capacity(
                str(draft),
                args.batches,
                args.sessions,
                args.gamma,
                args.warmup,
                args.duration,
                args.session_tokens,
                args.repeats,
                None if args.quiet else stderr_line,
            )
        )

    def report(points: list[CapacityPoint], machine: Machine) -> CapacityReport:
        summary = summarise_capacity(points)
        return CapacityReport(str(draft), args.session_tokens, args.repeats, machine, summary, points)

    return measure_and_publish("capacity", measure, report, args.json)
