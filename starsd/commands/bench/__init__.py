"""``starsd bench``: the benchmarks, one module each with ``configure(sub)`` and ``run(args) -> int``.

``star`` and ``profiles`` hold the star against the system model; ``capacity``, ``fairness``, ``gamma`` and
``protocol`` the draft's own benchmarks; ``serve`` loads an endpoint; ``measure-gpu`` and ``step`` time the
runners on an accelerator. ``common`` holds what they share. A benchmark imports its machinery
(:mod:`starsd.bench`) only when it runs.
"""

from __future__ import annotations

import argparse
import logging
import sys

from starsd.commands.bench import capacity, fairness, gamma, measure_gpu, profiles, protocol, serve, star, step
from starsd.commands.bench.star import build_config

__all__ = ["build_config", "configure", "run"]

# In the order `starsd bench --help` lists them.
BENCHMARKS = (star, profiles, capacity, fairness, gamma, protocol, serve, measure_gpu, step)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    for benchmark in BENCHMARKS:
        benchmark.configure(sub)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_bench", None)
    if handler is None:
        print(
            "starsd bench: choose a benchmark: star | serve | profiles | capacity | fairness | gamma | protocol | "
            "measure-gpu | step (see --help)",
            file=sys.stderr,
        )
        return 2
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # the emulated targets' connects are noise here
        logging.getLogger("starsd.verifier").setLevel(logging.WARNING)
    return int(handler(args))
