"""Benchmark reports as typed records: each report is a dataclass, and both its JSON and its table come from it.

A table is a list of :class:`Column`: a title, how to read the cell's value from a record, and how to format
it. The JSON is the record itself (:func:`to_json`), so the two cannot disagree about a figure.
"""

from __future__ import annotations

import dataclasses
import json
import math
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


def _path_text(value: Any) -> str:
    """A path in a report (a checkpoint, a log folder) as its text; anything else JSON cannot hold is an error."""
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"a report holds a {type(value).__name__}, which JSON cannot hold")


def write_json(path: Path | None, record: Any) -> None:
    """Write a report record as JSON to ``path`` (nothing when None) and say so."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(record), indent=2, default=_path_text) + "\n")
    print(f"wrote {path}")


@dataclass
class Machine:
    """Where and when a benchmark ran, and how busy the machine was at both ends (other work shows in every figure)."""

    cpus: int | None
    time: float
    loadavg_before: list[float] | None
    cpu_pressure_before: float | None  # Linux PSI: % of the last 60 s in which a runnable task waited for a CPU
    loadavg_after: list[float] | None = None
    cpu_pressure_after: float | None = None

    @classmethod
    def now(cls) -> Machine:
        return cls(os.cpu_count(), time.time(), _loadavg(), _cpu_pressure())

    def finished(self) -> Machine:
        """Note the load at the end of the run (returns itself)."""
        self.loadavg_after, self.cpu_pressure_after = _loadavg(), _cpu_pressure()
        return self

    def describe(self) -> str:
        return (
            f"host: {self.cpus} CPUs, load average {self.loadavg_before}, CPU pressure (some, 60 s) "
            f"{self.cpu_pressure_before}% before / {self.cpu_pressure_after}% after"
        )


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _cpu_pressure() -> float | None:
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0].split()
        return float(dict(item.split("=", 1) for item in first[1:] if "=" in item)["avg60"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def ratio(a: float, b: float) -> float | None:
    """``a / b``, or None when ``b`` is not positive (a figure that cannot be formed prints as a dash)."""
    return a / b if b > 0 else None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 <= q <= 1), interpolating linearly between order statistics; 0.0 if empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    if not values:
        return 0.0
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
