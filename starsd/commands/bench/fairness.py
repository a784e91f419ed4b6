"""``starsd bench fairness``: skewed demand on a fully loaded draft, ``--schedule fifo`` against ``fair``
(:mod:`starsd.bench.fairness`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from starsd.commands.bench.common import error, measure_and_publish

HELP = "skewed demand on a fully loaded draft: --schedule fifo vs fair"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--busy-sessions", type=int, default=16, help="sessions of the busy target")
    parser.add_argument("--small-targets", type=int, default=3, help="targets with one session each")
    parser.add_argument("--tq", type=float, default=0.004, help="emulated draft service time, seconds")
    parser.add_argument("--tp", type=float, default=0.002, help="emulated verify time, seconds")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--alpha", type=float, default=0.7, help="per-position acceptance")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per schedule")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from starsd.bench.fairness import FairnessConfig, FairnessPoint, FairnessReport, measure_fairness
    from starsd.bench.report import Machine

    if args.busy_sessions < 1 or args.small_targets < 1 or args.tq <= 0 or args.tp < 0 or args.duration <= 0:
        return error("--busy-sessions, --small-targets >= 1, --tq > 0, --tp >= 0, --duration > 0", "fairness")
    config = FairnessConfig(
        args.busy_sessions, args.small_targets, args.tq, args.tp, args.gamma, args.alpha, args.duration, args.warmup
    )

    def report(points: list[FairnessPoint], machine: Machine) -> FairnessReport:
        return FairnessReport(config, machine, points)

    return measure_and_publish(
        "fairness", lambda: asyncio.run(measure_fairness(("fifo", "fair"), config)), report, args.json
    )
