"""Progress on long work: a tqdm bar on a terminal, plain lines in a redirected log.

A tqdm bar redraws itself with carriage returns; written to a file (a CI log, ``kubectl logs``) it becomes one
ever-growing line. Off a terminal this prints one line per tenth of the work instead.
"""

from __future__ import annotations

import io
import sys
import time
from typing import Any, TextIO


class PlainProgress:
    """The part of tqdm's interface the project uses: ``update``, ``set_postfix``, ``close``, ``with``."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO) -> None:
        self.total, self.desc, self.unit, self.stream = total, desc.strip(), unit, stream
        self.n = 0
        self.postfix = ""
        self._next = max(1, total // 10)
        self._start = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next or self.n == self.total:
            elapsed = time.monotonic() - self._start
            line = f"{self.desc}: {self.n}/{self.total} {self.unit}s ({elapsed:.0f} s)"
            print(f"{line}, {self.postfix}" if self.postfix else line, file=self.stream, flush=True)
            while self._next <= self.n:
                self._next += max(1, self.total // 10)

    def set_postfix(self, refresh: bool = True, **values: object) -> None:
        """Figures shown after the count (tqdm's ``set_postfix``), e.g. the latest loss."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        pass

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int, desc: str, unit: str = "it", enabled: bool = True, stream: TextIO | None = None) -> Any:
    """A progress reporter for ``total`` steps: tqdm on a terminal, :class:`PlainProgress` otherwise."""
    out = stream or sys.stderr
    if enabled and out.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=out, dynamic_ncols=True, mininterval=1.0)
    if not enabled:
        return PlainProgress(total, desc, unit, io.StringIO())  # counted, never shown
    return PlainProgress(total, desc, unit, out)
