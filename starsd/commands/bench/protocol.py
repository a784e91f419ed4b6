"""``starsd bench protocol``: the protocol's overhead per round on loopback, greedy and sampled
(:mod:`starsd.bench.protocol`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from starsd.commands.bench.common import DEFAULT_DRAFT_MODEL, draft_checkpoint, measure_and_publish

HELP = "protocol overhead per round on loopback (greedy and sampled)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft-model", type=Path, default=DEFAULT_DRAFT_MODEL, help="draft checkpoint")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--rounds", type=int, default=500, help="measured rounds per mode")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from starsd.bench import protocol
    from starsd.bench.report import Machine

    draft = draft_checkpoint(args.draft_model, "protocol")
    if draft is None:
        return 2

    def report(results: list[protocol.ProtocolResult], machine: Machine) -> protocol.ProtocolReport:
        return protocol.ProtocolReport(str(draft), machine, results)

    return measure_and_publish(
        "protocol", lambda: protocol.run(draft, gamma=args.gamma, rounds=args.rounds), report, args.json
    )
