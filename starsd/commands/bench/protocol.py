"""``starsd bench protocol``: the protocol's overhead per round on loopback, greedy and sampled
(:mod:`starsd.bench.protocol`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from starsd.commands.bench.common import DEFAULT_DRAFT_MODEL, draft_checkpoint, measure_and_publish


def configure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    proto = sub.add_parser("protocol", help="protocol overhead per round on loopback (greedy and sampled)")
    proto.add_argument("--draft-model", type=Path, default=DEFAULT_DRAFT_MODEL, help="draft checkpoint")
    proto.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    proto.add_argument("--rounds", type=int, default=500, help="measured rounds per mode")
    proto.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    proto.set_defaults(_bench=run)


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
