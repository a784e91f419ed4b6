"""A resolver that a test controls (``starsd.verifier.discovery.Resolver``): no real DNS is touched."""

from __future__ import annotations

import socket
import threading


class FakeDns:
    """Answers every lookup with :attr:`answer` (addresses), or raises :attr:`error`; with :attr:`hang` set it
    blocks until :meth:`release` (a resolver that does not answer)."""

    def __init__(self, answer: list[str] | None = None) -> None:
        self.answer: list[str] = list(answer or [])
        self.error: Exception | None = None
        self.hang = False
        self.lookups = 0
        self._released = threading.Event()

    def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if self.hang:
            self._released.wait(60.0)
        if self.error is not None:
            raise self.error
        return list(self.answer)

    def nxdomain(self) -> None:
        self.error = socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def heal(self, answer: list[str]) -> None:
        self.error, self.hang, self.answer = None, False, list(answer)
        self._released.set()
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()
