"""A small TCP proxy for fault injection on loopback: add delay to a link, cut its connections, refuse new ones.

Put it between a client and a server (targets and the draft, say) and change the link while they run::

    with ThreadedFaultProxy("127.0.0.1", draft_port) as proxy:    # listens on a free loopback port
        start_targets(draft=proxy.address)
        proxy.set_delay(1.5)        # every byte now arrives 1.5 s later, in each direction
        proxy.set_delay(0.0)        # back to a plain relay (bytes already in flight keep their delay)
        proxy.cut()                 # abort every open connection (both ends see a reset)
        proxy.set_refusing(True)    # new connections are accepted and closed at once

It relays bytes, so any protocol works through it (gRPC over HTTP/2, TLS, HTTP/1.1). A delay is a latency,
not a bandwidth cap: each chunk is forwarded ``delay`` seconds after it was read, in order, so a stream of
chunks is shifted in time rather than slowed. Everything is bounded: connections (``max_connections``), and
per direction the bytes read ahead of the writer (``max_chunks`` chunks of ``chunk_bytes``), beyond which the
proxy stops reading and TCP flow control pushes back on the sender.

It listens and connects on loopback only: it is a test and debugging tool, not a network component.
``python -m tests.support.faults --upstream 127.0.0.1:50051 --port 50052 --delay 0.2`` runs one from a shell
(in the repository root).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_DELAY = 60.0  # seconds; a longer "delay" is a cut, and should be asked for as one


def _require_loopback(host: str, what: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the fault proxy works on loopback only; {what} {host!r} is not a loopback address")


@dataclass
class ProxyStats:
    accepted: int = 0  # connections relayed
    refused: int = 0  # connections closed at once (refusing, over max_connections, upstream down)
    cut: int = 0  # connections aborted by cut()
    open: int = 0  # connections open now
    bytes_up: int = 0  # client -> upstream
    bytes_down: int = 0  # upstream -> client


class _Link:
    """One proxied connection: the client's and the upstream's streams and the two relay tasks."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[bool]] = []

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """The proxy on the running event loop: ``await start()``, change ``delay`` at will, ``await close()``."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
        max_connections: int = 256,
        max_chunks: int = 64,
        chunk_bytes: int = 64 * 1024,
        connect_timeout: float = 5.0,
    ) -> None:
        _require_loopback(host, "listen address")
        _require_loopback(upstream_host, "upstream")
        if max_connections < 1 or max_chunks < 1 or chunk_bytes < 1:
            raise ValueError("max_connections, max_chunks and chunk_bytes must be >= 1")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.max_chunks = max_chunks
        self.chunk_bytes = chunk_bytes
        self.connect_timeout = connect_timeout
        self.refusing = False
        self.stats = ProxyStats()
        self._delay = 0.0
        self.delay = delay
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    @property
    def delay(self) -> float:
        """Seconds added to each direction of every connection (applies to bytes read from now on)."""
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        if not 0.0 <= seconds <= MAX_DELAY:
            raise ValueError(f"delay must be in 0..{MAX_DELAY} seconds, got {seconds}")
        self._delay = float(seconds)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "fault proxy %s -> %s:%d (delay %.3fs)", self.address, self.upstream_host, self.upstream_port, self.delay
        )
        return self

    async def close(self) -> None:
        """Stop listening and abort every connection."""
        if self._server is not None:
            self._server.close()
        await self.cut(count=False)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def cut(self, count: bool = True) -> int:
        """Abort every open connection; both ends see their connection reset. Returns how many."""
        links = list(self._links)
        for link in links:
            link.abort()
        tasks = [t for link in links for t in link.tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if count:
            self.stats.cut += len(links)
        return len(links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing or len(self._links) >= self.max_connections:
            self.stats.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.upstream_host, self.upstream_port), self.connect_timeout
            )
        except (OSError, TimeoutError):
            self.stats.refused += 1  # the upstream is down: the client sees its connection closed
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        self.stats.accepted += 1
        self.stats.open = len(self._links)
        link.tasks = [
            asyncio.create_task(self._relay(reader, up_writer, up=True)),
            asyncio.create_task(self._relay(up_reader, writer, up=False)),
        ]
        try:
            # An end of file is passed on and the other direction goes on (a half-close); a reset, an error
            # or a cut ends the connection for both ends at once.
            pending: set[asyncio.Task[bool]] = set(link.tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.cancelled() or t.exception() is not None or not t.result() for t in done):
                    link.abort()
                    break
        finally:
            for task in link.tasks:
                task.cancel()
            await asyncio.gather(*link.tasks, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self._links.discard(link)
            self.stats.open = len(self._links)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> bool:
        """Copy one direction; each chunk leaves ``delay`` seconds after it arrived, in arrival order.

        Returns True when the sender closed cleanly (its end of file was passed on), False on an error.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(self.max_chunks)
        clean = True

        async def read() -> None:
            nonlocal clean
            try:
                while data := await reader.read(self.chunk_bytes):
                    await queue.put((loop.time() + self._delay, data))
            except OSError:
                clean = False
            await queue.put((loop.time() + self._delay, None))  # the end, delayed like the data before it

        reading = asyncio.create_task(read())
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    if clean and writer.can_write_eof():
                        writer.write_eof()
                    return clean
                writer.write(data)
                await writer.drain()
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
        except OSError:
            return False
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


class ThreadedFaultProxy:
    """A :class:`FaultProxy` on an event loop of its own thread, driven from synchronous code (tests, scripts).

    A context manager; every method waits for the proxy's loop to carry it out.
    """

    def __init__(self, upstream_host: str, upstream_port: int, **options: Any) -> None:
        self.proxy = FaultProxy(upstream_host, upstream_port, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def address(self) -> str:
        return self.proxy.address

    @property
    def stats(self) -> ProxyStats:
        return self.proxy.stats

    def start(self) -> ThreadedFaultProxy:
        self._thread.start()
        self._call(self.proxy.start())
        return self

    def set_delay(self, seconds: float) -> None:
        async def apply() -> None:
            self.proxy.delay = seconds

        self._call(apply())

    def set_refusing(self, refusing: bool) -> None:
        async def apply() -> None:
            self.proxy.refusing = refusing

        self._call(apply())

    def cut(self) -> int:
        return self._call(self.proxy.cut())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self.proxy.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.faults",
        description="A loopback TCP proxy that adds delay to a link (to see how targets ride out a slow draft).",
    )
    parser.add_argument("--upstream", type=_host_port, required=True, metavar="HOST:PORT", help="where to relay to")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to each direction (default 0)")
    parser.add_argument("--max-connections", type=int, default=256, help="connections at once (default 256)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def serve() -> None:
        proxy = FaultProxy(
            *args.upstream, host=args.host, port=args.port, delay=args.delay, max_connections=args.max_connections
        )
        await proxy.start()
        print(
            f"relaying {proxy.address} -> {args.upstream[0]}:{args.upstream[1]} with {proxy.delay}s delay", flush=True
        )
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.close()

    try:
        asyncio.run(serve())
    except ValueError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
