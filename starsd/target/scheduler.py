"""Continuous batching on the event loop: who runs in the next model step, and who may start at all.

:class:`StepScheduler` collects the rows that are ready (a session whose draft answered, whose fallback round is
due, or whose prompt needs prefill) and runs them as one step on the model thread as soon as the previous step
ends; rows that arrive meanwhile join the next step. A step starts one event-loop turn after it could: the
sessions of the step that just ended resume in that turn and queue their next rounds, so they run together
instead of the first one to resume running alone. A session waiting for its draft is simply not in the
queue, so it never holds up the others, and a finished or cancelled session leaves at once.

:class:`KvBudget` admits completions: at most ``max_num_seqs`` run at once, and the key/value pool that holds
them stays within ``kv_tokens``. The pool gives every running completion a slot as long as the longest one's
reservation (prompt + max_tokens + gamma, reserved up front, so a running completion never runs out), so the
rule is ``running x longest reservation <= kv_tokens``. Others wait in arrival order; the HTTP server bounds
the wait queue and answers 429 beyond it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Row = TypeVar("Row")
Outcome = TypeVar("Outcome")


class BudgetExceeded(ValueError):
    """A completion needs more key/value tokens than the whole budget: it can never run here."""


@dataclass
class _Pending(Generic[Row, Outcome]):
    row: Row
    future: asyncio.Future[Outcome]
    cost: int  # tokens the row feeds (prefill budget)


class StepScheduler(Generic[Row, Outcome]):
    """Batches ready rows into steps of ``run_step(rows) -> outcomes`` on ``executor``.

    ``max_num_seqs`` bounds the rows of one step; ``max_step_tokens`` bounds the tokens they feed (a row wider
    than the whole bound still runs, alone with the narrow rows, so no row starves).
    """

    def __init__(
        self,
        run_step: Callable[[list[Row]], list[Outcome]],
        executor: Executor,
        max_num_seqs: int,
        max_step_tokens: int,
        on_step: Callable[[int, float], None] | None = None,
    ) -> None:
        self._run_step = run_step
        self._executor = executor
        self.max_num_seqs = max_num_seqs
        self.max_step_tokens = max_step_tokens
        self._on_step = on_step
        self._queue: collections.deque[_Pending[Row, Outcome]] = collections.deque()
        self._running = False
        self._start_soon = False  # a start is scheduled for the next event-loop turn

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def run(self, row: Row, cost: int) -> Outcome:
        """Run ``row`` in the next step that has room; ``cost`` is the number of tokens it feeds."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(row, future, cost))
        self._schedule_start()
        return await future  # a cancelled caller's row is skipped if it has not started yet

    def _take(self) -> list[_Pending[Row, Outcome]]:
        taken: list[_Pending[Row, Outcome]] = []
        tokens = 0
        skipped: list[_Pending[Row, Outcome]] = []
        while self._queue and len(taken) < self.max_num_seqs:
            item = self._queue.popleft()
            if item.future.done():  # cancelled while waiting
                continue
            if taken and tokens + item.cost > self.max_step_tokens:
                skipped.append(item)  # waits for the next step, keeping its place in line
                continue
            taken.append(item)
            tokens += item.cost
        self._queue.extendleft(reversed(skipped))
        return taken

    def _schedule_start(self) -> None:
        if not self._running and not self._start_soon:
            self._start_soon = True
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._start_soon = False
        if self._running:
            return
        batch = self._take()
        if not batch:
            return
        self._running = True
        rows = [item.row for item in batch]
        started = time.perf_counter()
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._run_step, rows)
        future.add_done_callback(lambda f: self._finish(batch, f, started))

    def _finish(self, batch: list[_Pending[Row, Outcome]], done: asyncio.Future[list[Outcome]], started: float) -> None:
        self._running = False
        elapsed = time.perf_counter() - started
        if self._on_step is not None:
            self._on_step(len(batch), elapsed)
        error = done.exception()
        outcomes = None if error is not None else done.result()
        for i, item in enumerate(batch):
            if item.future.done():
                continue
            if outcomes is not None:
                item.future.set_result(outcomes[i])
            else:
                assert error is not None
                item.future.set_exception(error)
        self._schedule_start()  # after the sessions woken above have queued their next rounds


@dataclass
class _Waiter:
    tokens: int
    future: asyncio.Future[None]


@dataclass
class KvBudget:
    """Admission by running sequences and reserved key/value tokens (see the module docstring)."""

    max_num_seqs: int
    kv_tokens: int
    _reservations: collections.Counter[int] = field(default_factory=collections.Counter)  # running: tokens -> count
    _waiters: collections.deque[_Waiter] = field(default_factory=collections.deque)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def running(self) -> int:
        return self._reservations.total()

    @property
    def reserved(self) -> int:
        """The pool's tokens in use: running completions x the longest reservation among them."""
        return self.running * max(self._reservations, default=0)

    def _fits(self, tokens: int) -> bool:
        running = self.running
        longest = max(tokens, max(self._reservations, default=0))
        return running < self.max_num_seqs and (running + 1) * longest <= self.kv_tokens

    async def acquire(self, tokens: int) -> None:
        if tokens > self.kv_tokens:
            raise BudgetExceeded(
                f"this completion needs {tokens} key/value tokens (prompt + max_tokens + gamma) but the target's "
                f"whole budget is {self.kv_tokens} (--kv-cache-tokens)"
            )
        if not self._waiters and self._fits(tokens):
            self._grant(tokens)
            return
        waiter = _Waiter(tokens, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():  # granted as it was cancelled
                self.release(tokens)
            else:
                self._waiters.remove(waiter)
                self._wake()
            raise

    def _grant(self, tokens: int) -> None:
        self._reservations[tokens] += 1

    def release(self, tokens: int) -> None:
        self._reservations[tokens] -= 1
        if not self._reservations[tokens]:
            del self._reservations[tokens]
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0].tokens):
            waiter = self._waiters.popleft()
            self._grant(waiter.tokens)
            waiter.future.set_result(None)
