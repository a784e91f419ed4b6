"""``starsd bench gamma``: fixed gamma against adaptive gamma, per shipped profile, at N* and 4xN*
(:mod:`starsd.bench.gamma`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from starsd.commands._common import positive_ints
from starsd.commands.bench.common import error, measure_and_publish, stderr_line

HELP = "fixed gamma 1..8 vs adaptive gamma, per shipped profile, at N* and 4xN*"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profiles", help="comma-separated profile names (default: every shipped profile)")
    parser.add_argument("--gammas", type=positive_ints, default=tuple(range(1, 9)), help="fixed gammas to compare")
    parser.add_argument("--n-multipliers", type=positive_ints, default=(1, 4), help="N = N* times each")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds per point before measuring")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    from starsd.bench import profiles
    from starsd.bench.gamma import GammaPoint, GammaReport, measure_gamma, summarise_gamma
    from starsd.bench.report import Machine

    names = [n.strip() for n in args.profiles.split(",")] if args.profiles else profiles.names()
    try:
        for name in names:
            profiles.get(name)
    except (KeyError, ValueError) as exc:
        return error(str(exc), "gamma")
    if args.duration <= 0 or args.warmup < 0:
        return error("--duration must be > 0 and --warmup >= 0", "gamma")
    progress = None if args.quiet else stderr_line

    def measure() -> list[GammaPoint]:
        measuring = measure_gamma(
            names, args.gammas, args.n_multipliers, args.warmup, args.duration, max(args.gammas), progress
        )
        return asyncio.run(measuring)

    def report(points: list[GammaPoint], machine: Machine) -> GammaReport:
        return GammaReport(machine, points, summarise_gamma(points))

    return measure_and_publish("gamma", measure, report, args.json)
