"""What the benchmarks share: their error line, their progress lines, the draft checkpoint they default to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Protocol

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


def draft_checkpoint(path: Path, bench: str) -> Path | None:
    """``path`` when it holds a checkpoint; otherwise ``None``, after saying how to make one."""
    if (path / "config.json").exists():
        return path
    print(
        f"starsd bench {bench}: no draft checkpoint at {path} (`starsd models tiny --out DIR` writes one)",
        file=sys.stderr,
    )
    return None
