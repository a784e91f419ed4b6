"""The fault proxy relays bytes faithfully, delays them by at least what it is told, and cuts and refuses on cue."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.faults import FaultProxy, ThreadedFaultProxy

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _read_to_eof_then_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server that answers only once the client has half-closed: it needs the proxy to pass the EOF on."""
    data = await reader.read()
    writer.write(b"got %d bytes" % len(data))
    await writer.drain()
    writer.close()


def _run(scenario: Callable[[FaultProxy], Awaitable[None]], handler: Handler = _echo, **options: object) -> None:
    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proxy = await FaultProxy("127.0.0.1", port, **options).start()  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(scenario(proxy), 60)
        finally:
            await proxy.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(proxy.host, proxy.port)


def test_bytes_pass_unchanged_both_ways_with_backpressure() -> None:
    payload = os.urandom(3 << 20)  # larger than the proxy's read-ahead bound: it must push back, not drop

    async def scenario(proxy: FaultProxy) -> None:
        reader, writer = await _connect(proxy)

        async def send() -> None:
            for i in range(0, len(payload), 100_000):
                writer.write(payload[i : i + 100_000])
                await writer.drain()

        sending = asyncio.create_task(send())
        echoed = await reader.readexactly(len(payload))
        await sending
        assert echoed == payload
        writer.close()
        assert proxy.stats.bytes_up == len(payload) and proxy.stats.bytes_down == len(payload)
        assert proxy.stats.accepted == 1

    _run(scenario, max_chunks=4, chunk_bytes=16 * 1024)


def test_a_delay_holds_every_byte_back_in_each_direction() -> None:
    delay = 0.3

    async def scenario(proxy: FaultProxy) -> None:
        reader, writer = await _connect(proxy)
        for _ in range(3):
            start = time.monotonic()
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            # Causality, not speed: a byte can not come back before it went through the proxy twice.
            assert time.monotonic() - start >= 2 * delay
        proxy.delay = 0.0
        writer.write(b"pong")
        assert await reader.readexactly(4) == b"pong"
        writer.close()

    _run(scenario, delay=delay)


def test_a_half_close_is_passed_on_and_the_answer_still_comes_back() -> None:
    async def scenario(proxy: FaultProxy) -> None:
        reader, writer = await _connect(proxy)
        writer.write(b"x" * 1000)
        writer.write_eof()
        assert await reader.read() == b"got 1000 bytes"
        writer.close()

    _run(scenario, handler=_read_to_eof_then_answer, delay=0.05)


def test_cut_resets_open_connections_and_new_ones_work() -> None:
    async def scenario(proxy: FaultProxy) -> None:
        reader, writer = await _connect(proxy)
        writer.write(b"a")
        assert await reader.readexactly(1) == b"a"
        assert await proxy.cut() == 1
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await reader.readexactly(1)
        assert proxy.stats.cut == 1
        reader2, writer2 = await _connect(proxy)
        writer2.write(b"b")
        assert await reader2.readexactly(1) == b"b"
        writer2.close()

    _run(scenario)


def test_refusing_and_the_connection_bound_close_new_connections_at_once() -> None:
    async def scenario(proxy: FaultProxy) -> None:
        held = [await _connect(proxy) for _ in range(2)]
        for reader, writer in held:  # both relayed
            writer.write(b"k")
            assert await reader.readexactly(1) == b"k"
        reader, _ = await _connect(proxy)  # a third one is over the bound
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await reader.readexactly(1)
        for _, writer in held:
            writer.close()
        for _ in range(100):  # the proxy notices the closes
            if proxy.stats.open == 0:
                break
            await asyncio.sleep(0.05)
        assert proxy.stats.open == 0
        proxy.refusing = True
        reader, _ = await _connect(proxy)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await reader.readexactly(1)
        assert proxy.stats.refused == 2 and proxy.stats.accepted == 2

    _run(scenario, max_connections=2)


def test_an_unreachable_upstream_closes_the_client_connection() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # bound, never listening: connections to it are refused

        async def main() -> None:
            proxy = await FaultProxy("127.0.0.1", dead_port).start()
            try:
                reader, _ = await _connect(proxy)
                with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                    await asyncio.wait_for(reader.readexactly(1), 10)
                assert proxy.stats.refused == 1
            finally:
                await proxy.close()

        asyncio.run(main())


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "192.168.0.1", "example.com", "::"])
def test_only_loopback_addresses_are_accepted(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy(host, 1)
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("127.0.0.1", 1, host=host)


@pytest.mark.parametrize("delay", [-0.1, 61.0, float("nan")])
def test_a_delay_out_of_range_is_refused(delay: float) -> None:
    proxy = FaultProxy("127.0.0.1", 1)
    with pytest.raises(ValueError, match="delay"):
        proxy.delay = delay


def test_the_threaded_proxy_is_driven_from_synchronous_code() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with ThreadedFaultProxy("127.0.0.1", port) as proxy:
            host, _, proxy_port = proxy.address.rpartition(":")
            with socket.create_connection((host, int(proxy_port)), timeout=10) as client:
                conn, _ = server.accept()
                with conn:
                    client.sendall(b"hello")
                    assert conn.recv(5) == b"hello"
                    proxy.set_delay(0.2)
                    proxy.set_refusing(True)
                    assert proxy.cut() == 1
                    conn.settimeout(10)
                    assert conn.recv(5) == b""  # the upstream side saw the cut too
            assert proxy.stats.cut == 1


def test_the_command_line_refuses_a_non_loopback_upstream() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.faults", "--upstream", "10.0.0.1:50051"],
        cwd=Path(__file__).resolve().parents[2],  # the repository root, where `tests` is importable
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "loopback" in result.stderr
