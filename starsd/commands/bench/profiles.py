"""``starsd bench profiles``: the accelerator profiles and their sources (:mod:`starsd.bench.profiles`)."""

from __future__ import annotations

import argparse
import json

HELP = "the accelerator profiles and their sources"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from starsd.bench import profiles

    if args.json:
        print(json.dumps([p.to_dict() for p in profiles.PROFILES], indent=2))
    else:
        print("\n\n".join(profiles.describe(p) for p in profiles.PROFILES))
    return 0
