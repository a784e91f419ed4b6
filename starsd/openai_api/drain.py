"""Draining a target before it stops: the pod's preStop hook calls ``GET /drain`` from inside the pod.

Only a caller on the loopback interface may drain (anyone else gets 403): a drain takes the target out of
service until it restarts, so a client that can reach the serving port must not be able to do it.

From that moment ``/readyz`` answers 503 (the Service stops sending new clients), a new completion is answered
503 with ``Retry-After`` (a client that still reaches this pod retries elsewhere), and ``/drain`` answers only
when every completion in flight has finished, or after ``?timeout=SECONDS``. The kubelet sends SIGTERM after
the hook returns, and ends the pod at ``terminationGracePeriodSeconds`` whatever happens, which is what bounds
a drain in a pod.

:func:`install` adds the middleware and the route to an aiohttp application; nothing else of the server
changes.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

log = logging.getLogger(__name__)

DRAIN_PATH = "/drain"
READY_PATH = "/readyz"
RETRY_AFTER_SECONDS = 1
DRAINING_KEY: web.AppKey[Drain] = web.AppKey("starsd_drain")
LOOPBACK = frozenset({"127.0.0.1", "::1"})


def _is_work(request: web.Request) -> bool:
    """A request that produces completions (what a drain waits for and refuses once draining)."""
    return request.method == "POST" and request.path.startswith("/v1/")


class Drain:
    """In-flight completions, and whether the server is draining."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        if not self.draining:
            log.info("draining: %d completions in flight; new ones are refused", self.in_flight)
        self.draining = True

    async def wait_idle(self, timeout: float | None) -> bool:
        """True when no completion is in flight (within ``timeout`` seconds; ``None``: however long)."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.draining and request.method == "GET" and request.path == READY_PATH:
            return web.json_response({"status": "draining", "in_flight": self.in_flight}, status=503)
        if not _is_work(request):
            return await handler(request)
        if self.draining:
            error = {
                "message": "this target is shutting down; retry on another",
                "type": "service_unavailable",
                "param": None,
                "code": "draining",
            }
            return web.json_response({"error": error}, status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.in_flight += 1
        self._idle.clear()
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /drain[?timeout=SECONDS]``: start draining, answer once idle (200) or at the timeout (503)."""
        if request.remote not in LOOPBACK:
            message = "a drain is asked from inside the pod (its preStop hook), not over the network"
            return web.json_response({"error": {"message": message, "code": "forbidden"}}, status=403)
        text = request.query.get("timeout")
        try:
            timeout = float(text) if text is not None else None
            if timeout is not None and timeout < 0:
                raise ValueError
        except ValueError:
            return web.json_response({"error": {"message": f"timeout must be seconds >= 0, got {text!r}"}}, status=400)
        started = time.monotonic()
        self.start()
        idle = await self.wait_idle(timeout)
        waited = round(time.monotonic() - started, 3)
        log.info("drain %s after %.1fs (%d in flight)", "done" if idle else "timed out", waited, self.in_flight)
        body = {"status": "drained" if idle else "timeout", "in_flight": self.in_flight, "waited_seconds": waited}
        return web.json_response(body, status=200 if idle else 503)


def install(app: web.Application) -> Drain:
    """Make ``app`` drainable; returns its :class:`Drain` (also at ``app[DRAINING_KEY]``)."""
    drain = Drain()
    app[DRAINING_KEY] = drain
    app.middlewares.insert(0, drain.middleware)
    app.router.add_get(DRAIN_PATH, drain.handle)
    return drain
