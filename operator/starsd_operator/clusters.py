"""One writer per cluster: the handlers, the tick and the repairs a watched child triggers take turns.

kopf runs a cluster's change handlers and its timer concurrently, and each call gets the body kopf held when
it started. :class:`Clusters` gives every cluster one lock, the newest body seen on the watch, and the
:class:`~.controller.Memory` the passes share. :meth:`Clusters.exclusive` runs one pass under the lock, in a
worker thread (the controller and the API client are synchronous), on the newest body known when the lock
is taken: a tick started on generation G that waited behind the handler of G+1 works on G+1, and a pass on G
that is still running when G+1 arrives finishes before G+1's handler writes anything.

:meth:`Clusters.poke` asks for a repair pass when a watched child changes (at most one pending per
cluster), so a deleted Service comes back within a second or two rather than at the next tick.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .controller import Memory
from .kube import KubeError

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
T = TypeVar("T")

# Worker threads for the passes: they wait on the API server and the drafts' /v1/load (up to its timeout), so a
# few slow clusters must not hold up a handler of another (asyncio's default pool has cores + 4 threads).
WORKERS = 32

# A burst of watch events (an apply touches several children) makes one repair pass, this long after the first.
POKE_DELAY = 0.2


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    body: Mapping[str, Any] | None = None
    memory: Memory = field(default_factory=Memory)
    poked: bool = False


def key_of(body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def newest(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The later of two bodies of one object: by resourceVersion where both are numbers (etcd's revisions),
    else by generation; ``b`` on a tie."""
    if a is None or b is None:
        return b if a is None else a

    def rank(body: Mapping[str, Any]) -> tuple[int, int]:
        meta = body.get("metadata") or {}
        version = str(meta.get("resourceVersion") or "")
        return (int(version) if version.isdigit() else -1, int(meta.get("generation") or 0))

    ra, rb = rank(a), rank(b)
    if ra[0] >= 0 and rb[0] >= 0:
        return a if ra[0] > rb[0] else b
    return a if ra[1] > rb[1] else b


class Clusters:
    """The operator's per-cluster state (one per operator process, shared by every handler)."""

    def __init__(self) -> None:
        self._entries: dict[Key, _Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="starsd-pass")

    def _entry(self, key: Key) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        return entry

    def memory(self, key: Key) -> Memory:
        return self._entry(key).memory

    def seen(self, body: Mapping[str, Any]) -> None:
        """Record a body from the watch (or a handler's): kept when it is newer than the one held."""
        entry = self._entry(key_of(body))
        entry.body = newest(entry.body, body)

    def gone(self, key: Key) -> None:
        """The cluster was deleted: forget it."""
        self._entries.pop(key, None)

    def latest(self, key: Key) -> Mapping[str, Any] | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.body

    async def exclusive(
        self, key: Key, body: Mapping[str, Any] | None, work: Callable[[Mapping[str, Any], Memory], T]
    ) -> T | None:
        """Run ``work(newest body, memory)`` in a worker thread, alone for this cluster; ``body`` is the one the
        caller was given (offered first). None when no body is known (the cluster is gone)."""
        if body is not None:
            self.seen(body)
        entry = self._entry(key)
        async with entry.lock:
            current = entry.body
            if current is None:
                return None
            call = functools.partial(contextvars.copy_context().run, work, current, entry.memory)
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def poke(self, key: Key, repair: Callable[[Key], Awaitable[None]]) -> None:
        """Ask for ``repair(key)`` soon; one pass covers every poke that arrives before it starts."""
        entry = self._entries.get(key)
        if entry is None or entry.body is None or entry.poked:
            return
        entry.poked = True

        async def later() -> None:
            await asyncio.sleep(POKE_DELAY)
            entry.poked = False
            try:
                await repair(key)
            except Exception as exc:  # a failed repair is retried by the next poke or tick
                if isinstance(exc, KubeError) and exc.namespace_terminating:
                    # The namespace's deletion removes the children before the cluster: no drift to repair.
                    log.info("not repairing %s/%s: its namespace is being deleted", *key)
                else:
                    log.exception("repairing %s/%s failed", *key)

        task = asyncio.get_running_loop().create_task(later())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
