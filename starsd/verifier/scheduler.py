"""Continuous batching on the event loop: who runs in the next model step, and who may start at all.

:class:`StepScheduler` collects the rows that are ready (a session whose draft answered, whose fallback round is
due, or whose prompt needs prefill) and runs them as one step on the model thread as soon as the previous step
ends; rows that arrive meanwhile join the next step. A step starts one event-loop turn after it could: the
sessions of the step that just ended resume in that turn and queue their next rounds, so they run together
instead of the first one to resume running alone. A finished or cancelled session leaves at once.

Rows whose draft proposals are on their way are waited for, briefly. A step's cost hardly grows with its rows
(the weights are read once per step, on a GPU as on a CPU), so a step that starts with the first rows whose
proposals came back, leaving the rest for the step after, spends two steps where one would do, and the
sessions drift apart into ever smaller steps. The sessions of one step form a *cohort*: they ask the draft
together, and it answers them together (see starsd.draft.buffer). A session announces its row with
:meth:`StepScheduler.expect` before it asks the draft, and a step holds back while a ready row's cohort still has
rows on their way, until they are in, the step is full, or the ready rows have waited about one step's time.
Other cohorts (sessions whose proposals went out later, while this cohort's step ran) are not waited for: they
run in the next step, so that the model verifies one cohort while the draft drafts for another.

:class:`KvBudget` admits completions: at most ``max_num_seqs`` run at once, and the key/value pool that holds
them stays within ``kv_tokens``. The pool gives every running completion a slot as long as the longest one's
reservation (prompt + max_tokens + gamma, reserved up front, so a running completion never runs out), so the
rule is ``running x longest reservation <= kv_tokens``. Others wait in arrival order; the HTTP server bounds
the wait queue and answers 429 beyond it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Iterator
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
    cohort: int | None = None  # the step the row's session ran in last (see the module docstring)


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
        max_gather_seconds: float = 0.05,
    ) -> None:
        self._run_step = run_step
        self._executor = executor
        self.max_num_seqs = max_num_seqs
        self.max_step_tokens = max_step_tokens
        self._on_step = on_step
        self._queue: collections.deque[_Pending[Row, Outcome]] = collections.deque()
        self._running = False
        self._start_soon = False  # a start is scheduled for the next event-loop turn
        self.max_gather_seconds = max_gather_seconds  # the longest a ready row waits for its cohort
        self.finished_steps = 0  # steps run so far: a step's number is its rows' next cohort
        self._expected: collections.Counter[int] = collections.Counter()  # cohort -> rows on their way
        self._last_step_seconds = 0.0
        self._gather_deadline: float | None = None  # when the ready rows stop waiting for incoming ones
        self._gather_timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def run(self, row: Row, cost: int, cohort: int | None = None) -> Outcome:
        """Run ``row`` in the next step that has room; ``cost`` is the number of tokens it feeds, ``cohort`` the
        one it announced with :meth:`expect` (it arrives with this call)."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(row, future, cost, cohort))
        self._schedule_start()
        return await future  # a cancelled caller's row is skipped if it has not started yet

    @contextlib.contextmanager
    def expect(self, cohort: int) -> Iterator[None]:
        """Within this block, a row of ``cohort`` is on its way (its session awaits its draft proposal); it has
        arrived, or will not come, when the block ends."""
        self._expected[cohort] += 1
        try:
            yield
        finally:
            self._expected[cohort] -= 1
            if not self._expected[cohort]:
                del self._expected[cohort]
                self._schedule_start()  # nothing more of this cohort comes: its ready rows need not wait

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

    def _gathering(self) -> bool:
        """Whether to hold the ready rows back a little for rows of their cohort (see the module docstring)."""
        if not self._expected or len(self._queue) >= self.max_num_seqs:
            return False
        if not any(item.cohort in self._expected for item in self._queue):
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._gather_deadline is None:
            self._gather_deadline = now + min(self._last_step_seconds, self.max_gather_seconds)
            self._gather_timer = loop.call_at(self._gather_deadline, self._schedule_start)
        return now < self._gather_deadline

    def _start(self) -> None:
        self._start_soon = False
        if self._running or not self._queue:
            return
        if self._gathering():
            return  # a row's arrival, or the deadline's timer, calls again
        if self._gather_timer is not None:
            self._gather_timer.cancel()
        self._gather_timer = self._gather_deadline = None
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
        self._last_step_seconds = elapsed
        self.finished_steps += 1
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
