"""``starsd bench``: the benchmarks, one module each with ``HELP``, ``configure(parser)`` and ``run(args) -> int``.

``star`` and ``profiles`` hold the star against the system model; ``capacity``, ``fairness``, ``gamma`` and
``protocol`` the draft's own benchmarks; ``serve`` loads an endpoint; ``vllm`` compares vLLM with and without a
StarSD draft; ``measure-gpu`` and ``step`` time the runners on an accelerator. ``common`` holds what they share.
A benchmark imports its machinery (:mod:`starsd.bench`) only when it runs.
"""

from __future__ import annotations

import argparse
import logging
import sys

from starsd.commands.bench import capacity, fairness, gamma, measure_gpu, profiles, protocol, serve, star, step, vllm
from starsd.commands.bench.star import build_config

__all__ = ["build_config", "configure", "run"]

# In the order `starsd bench --help` lists them.
BENCHMARKS = (star, profiles, capacity, fairness, gamma, protocol, serve, vllm, measure_gpu, step)


def configure(parser: argparse.ArgumentParser) -> None:
    """One sub-command per module, named after it (``measure_gpu``: ``measure-gpu``), with its ``HELP`` (and
    ``DESCRIPTION``, where it has one), its flags, and its ``run``."""
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    for benchmark in BENCHMARKS:
        name = benchmark.__name__.rsplit(".", 1)[1].replace("_", "-")
        p = sub.add_parser(name, help=benchmark.HELP, description=getattr(benchmark, "DESCRIPTION", None))
        benchmark.configure(p)
        p.set_defaults(_bench=benchmark.run)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_bench", None)
    if handler is None:
        print(
            "starsd bench: choose a benchmark: star | serve | profiles | capacity | fairness | gamma | protocol | "
            "vllm | measure-gpu | step (see --help)",
            file=sys.stderr,
        )
        return 2
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # the emulated targets' connects are noise here
        logging.getLogger("starsd.verifier").setLevel(logging.WARNING)
    return int(handler(args))
