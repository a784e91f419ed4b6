"""The draft's global request buffer, shared by every target's stream and drained by the compute thread.

Policies:
* ``fifo``: arrival order, as in the StarSD paper.
* ``fair``: round-robin over targets (optionally weighted), so that a target with many sessions cannot crowd
  out targets with few: each pass gives every waiting target up to ``weight`` requests in turn.

A target's requests come in bursts (the sessions of one verification step ask together), and each says how many
of its burst follow it (``following``). ``take`` can hold a batch up to ``gather`` seconds for the requests still
announced, so that a burst drafts as one batch rather than its first request alone and then the rest; with
nothing announced it takes at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

POLICIES = ("fifo", "fair")


class RequestBuffer(Generic[T]):
    """Thread-safe: the event loop puts, the compute thread takes (blocking) up to a batch at a time."""

    def __init__(self, policy: str = "fifo", weights: dict[str, int] | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown schedule {policy!r}: choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self.weights = weights or {}
        self._cond = threading.Condition()
        self._queues: OrderedDict[str, deque[T]] = OrderedDict()  # per target, in round-robin order
        self._fifo: deque[T] = deque()
        self._credit: dict[str, int] = {}
        self._size = 0
        self._closed = False
        self._announced: dict[str, int] = {}  # per target: requests its latest request said follow it

    def __len__(self) -> int:
        return self._size

    @property
    def announced(self) -> int:
        """Requests announced by the targets and not yet arrived."""
        return sum(self._announced.values())

    def announce(self, target_id: str, following: int) -> None:
        """A request of ``target_id`` arrived (queued or not) saying ``following`` more of its burst come next."""
        with self._cond:
            if following > 0:
                self._announced[target_id] = following
            elif self._announced.pop(target_id, None):
                self._cond.notify_all()

    def put(self, target_id: str, item: T) -> None:
        with self._cond:
            if self.policy == "fifo":
                self._fifo.append(item)
            else:
                self._queues.setdefault(target_id, deque()).append(item)
            self._size += 1
            self._cond.notify()

    def forget_target(self, target_id: str) -> None:
        """The target is gone: nothing more of its burst will arrive."""
        with self._cond:
            if self._announced.pop(target_id, None):
                self._cond.notify_all()

    def discard(self, drop: Callable[[T], bool]) -> int:
        """Remove every waiting item for which ``drop`` is true (their target is gone); returns how many."""
        with self._cond:
            before = self._size
            self._fifo = deque(item for item in self._fifo if not drop(item))
            for target in list(self._queues):
                kept = deque(item for item in self._queues[target] if not drop(item))
                if kept:
                    self._queues[target] = kept
                else:
                    del self._queues[target]
                    self._credit.pop(target, None)
            self._size = len(self._fifo) + sum(len(q) for q in self._queues.values())
            return before - self._size

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, max_items: int, timeout: float | None = None, gather: float = 0.0) -> list[T]:
        """Block until something waits (or timeout/close), then take up to ``max_items`` by the policy, after
        waiting up to ``gather`` seconds more while requests announced by a burst are still on their way."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._size > 0 or self._closed, timeout=timeout):
                return []
            if gather > 0 and max_items > 1:
                self._cond.wait_for(
                    lambda: self._size >= max_items or not self._announced or self._closed, timeout=gather
                )
            items: list[T] = []
            while self._size and len(items) < max_items:
                items.append(self._pop())
            return items

    def _pop(self) -> T:
        self._size -= 1
        if self.policy == "fifo":
            return self._fifo.popleft()
        target, queue = next(iter(self._queues.items()))
        item = queue.popleft()
        credit = self._credit.get(target, self.weights.get(target, 1)) - 1
        if not queue:
            del self._queues[target]
            self._credit.pop(target, None)
        elif credit <= 0:
            self._queues.move_to_end(target)  # its turn is over: to the back of the round
            self._credit.pop(target, None)
        else:
            self._credit[target] = credit
        return item
