"""The ``starsd`` command line: one console script, one sub-command per job.

Each sub-command lives in ``starsd.commands.<name>`` and exposes ``configure(parser)`` and ``run(args) -> int``.
Modules are imported only when their command runs, so ``starsd plan --help`` does not pay for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "draft": ("starsd.commands.draft", "serve the draft model over gRPC"),
    "target": ("starsd.commands.target", "serve a target model over HTTP, verifying the draft's proposals"),
    "local": ("starsd.commands.local", "run one draft and N targets on this machine"),
    "demo": (
        "starsd.commands.demo",
        "the main job on the embedded default: a local star, a workload, a summary",
    ),
    "plan": ("starsd.commands.plan", "the system model: regime, utilisation, throughput and N* over N"),
    "bench": ("starsd.commands.bench", "benchmarks (`starsd bench star`)"),
    "operator": ("starsd.commands.operator", "run the Kubernetes operator with the current kubeconfig"),
    "models": (
        "starsd.commands.models",
        "create tiny model pairs (random, for tests) or train the shipped pair",
    ),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="starsd",
        description="StarSD: one-for-many speculative decoding. One draft model serves many target models.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ERROR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the command being run (or all, for top-level --help) has its module imported.
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            module = importlib.import_module(module_name)
            module.configure(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
