"""Benchmark reports as typed records: each report is a dataclass, and both its JSON and its table come from it.

A table is a list of :class:`Column`: a title, how to read the cell's value from a record, and how to format
it. The JSON is the record itself (:func:`to_json`), so the two cannot disagree about a figure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class Column(Generic[R]):
    """One column of a table of records of type ``R``."""

    title: str
    value: Callable[[R], Any]  # the cell's value; None prints a dash
    spec: str = ""  # format spec of the value, e.g. ".1f"
    width: int = 8
    left: bool = False  # align left (names) instead of right (figures)
    scale: float = 1.0  # multiply numbers by this before formatting (1e3: seconds as ms)
    unit: str = ""  # appended to every formatted value

    def _fit(self, text: str) -> str:
        return text.ljust(self.width) if self.left else text.rjust(self.width)

    def head(self) -> str:
        return self._fit(self.title)

    def cell(self, record: R) -> str:
        value = self.value(record)
        if value is None:
            return self._fit("-")
        if isinstance(value, int | float) and not isinstance(value, bool) and self.scale != 1.0:
            value = value * self.scale
        return self._fit(format(value, self.spec) + self.unit)


def table(records: Sequence[R], columns: Sequence[Column[R]], sep: str = "") -> list[str]:
    """The header line and one line per record."""
    lines = [sep.join(c.head() for c in columns)]
    lines += [sep.join(c.cell(r) for r in [record] for c in columns) for record in records]
    return lines


def to_json(record: Any) -> Any:
    """A report record (a dataclass, possibly nested) as JSON-ready dicts and lists."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return record


def write_json(path: Path | None, record: Any) -> None:
    """Write a report record as JSON to ``path`` (nothing when None) and say so."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(record), indent=2) + "\n")
    print(f"wrote {path}")


@dataclass(frozen=True)
class Machine:
    """Where and when a benchmark ran (a shared machine's load shows in every figure)."""

    loadavg_before: list[float]
    cpus: int | None
    time: float

    @classmethod
    def now(cls) -> Machine:
        return cls(list(os.getloadavg()), os.cpu_count(), time.time())


def ratio(a: float, b: float) -> float | None:
    """``a / b``, or None when ``b`` is not positive (a figure that cannot be formed prints as a dash)."""
    return a / b if b > 0 else None
