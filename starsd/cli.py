"""The ``starsd`` command line: one console script, one sub-command per job.

Each sub-command lives in ``starsd.commands.<name>`` (``-`` in the name as ``_``) and exposes
``configure(parser)`` and ``run(args) -> int``. Modules are imported only when their command runs, so
``starsd plan --help`` does not pay for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from starsd import __version__

# The exit status of a process whose reader went away (128 + SIGPIPE), as a shell reports it.
EXIT_BROKEN_PIPE = 141

# name -> one-line help; the command `fetch-model` lives in starsd.commands.fetch_model
COMMANDS: dict[str, str] = {
    "draft": "serve the draft model over gRPC",
    "target": "serve a target model over HTTP, verifying the draft's proposals",
    "local": "run one draft and N targets on this machine",
    "demo": "the main job on the embedded default: a local star, a workload, a summary",
    "plan": "the system model: regime, utilisation, throughput and N* over N",
    "bench": "benchmarks (`starsd bench star`)",
    "operator": "run the Kubernetes operator with the current kubeconfig",
    "fetch-model": "download a model (hf://, s3://, gs://, https:// tarball) into a directory and verify it",
    "models": "create tiny model pairs (random, for tests) or train the shipped pair",
}


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a default worth saying and its help does not
    already name one; unlike ``argparse.ArgumentDefaultsHelpFormatter``, it never says ``(default: None)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or action.required
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
            or "default" in text.lower()
            or "%(default)" in text
        ):
            return action.help
        return f"{text} (default: %(default)s)"


def use_formatter(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every sub-command parser under it the shared :class:`HelpFormatter`."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                use_formatter(child)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="starsd",
        description="StarSD: one-for-many speculative decoding. One draft model serves many target models.",
    )
    parser.add_argument("--version", action="version", version=f"starsd {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ERROR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the command being run (or all, for top-level --help) has its module imported.
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            module = importlib.import_module(f"starsd.commands.{name.replace('-', '_')}")
            module.configure(p)
            p.set_defaults(_run=module.run)
    use_formatter(parser)
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
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left (`| head`) is noticed here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit cannot fail on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's capture): nothing to flush
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
