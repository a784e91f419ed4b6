"""What the benchmarks share: their error line, their progress lines, the draft checkpoint they default to, the
models they time, and how a measurement becomes a published report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from starsd.bench.report import Machine

T = TypeVar("T")

DEFAULT_DRAFT_MODEL = Path("models/draft")


def error(message: str, bench: str) -> int:
    """Say what is wrong with ``starsd bench BENCH`` on stderr; the exit status of a refused command."""
    print(f"starsd bench {bench}: {message}", file=sys.stderr)
    return 2


def stderr_line(line: str) -> None:
    """A progress line, on stderr (the results go to stdout)."""
    print(line, file=sys.stderr)


class Report(Protocol):
    """A benchmark's report: a table for the terminal, and its fields for JSON."""

    def table(self) -> str: ...


def publish(report: Report, path: Path | None) -> int:
    """Print the report's table and, when ``path`` is given, write it there as JSON; exit status 0."""
    from starsd.bench.report import write_json

    print(report.table())
    write_json(path, report)
    return 0


def measure_and_publish(
    bench: str, measure: Callable[[], T], report: Callable[[T, Machine], Report], path: Path | None
) -> int:
    """Run ``measure``, noting the machine's load before and after, and publish ``report`` of its result; a
    ``RuntimeError`` (a server that did not start, a run that failed) becomes ``bench``'s error line."""
    from starsd.bench.report import Machine

    machine = Machine.now()
    try:
        result = measure()
    except RuntimeError as exc:
        return error(str(exc), bench)
    return publish(report(result, machine.finished()), path)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--draft`` and ``--target``: a Llama shape with random weights, or a checkpoint directory."""
    from starsd.bench.measure_gpu import SHAPES

    shapes = ", ".join(sorted(SHAPES))
    model_help = f"a Llama shape with random weights ({shapes}) or a checkpoint directory"
    parser.add_argument("--draft", default="llama-1b", metavar="SHAPE|PATH", help=model_help)
    parser.add_argument("--target", default="llama-8b", metavar="SHAPE|PATH", help=model_help)


def model_error(args: argparse.Namespace) -> str | None:
    """The complaint about a ``--draft`` or ``--target`` that is neither a shape nor a directory, or None."""
    from starsd.bench.measure_gpu import SHAPES

    for flag, model in (("--draft", args.draft), ("--target", args.target)):
        if model not in SHAPES and not Path(model).is_dir():
            return f"{flag} {model!r} is neither a shape ({', '.join(sorted(SHAPES))}) nor a directory"
    return None


def draft_checkpoint(path: Path, bench: str) -> Path | None:
    """``path`` when it holds a checkpoint; otherwise ``None``, after saying how to make one."""
    if (path / "config.json").exists():
        return path
    print(
        f"starsd bench {bench}: no draft checkpoint at {path} (`starsd models tiny --out DIR` writes one)",
        file=sys.stderr,
    )
    return None
