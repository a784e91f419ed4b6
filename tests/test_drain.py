"""The preStop drain over real HTTP on loopback: readiness fails at once, new completions are refused with 503,
the completion in flight finishes, and /drain answers only then (or at its timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from starsd.openai_api import drain


class SlowApp:
    """A completions endpoint that answers when the test says so: the in-flight work a drain waits for."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def completions(self, _: web.Request) -> web.Response:
        self.started.set()
        await self.release.wait()
        return web.json_response({"choices": [{"text": "done"}]})

    async def readyz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[SlowApp, str]]:
    slow = SlowApp()
    app = web.Application()
    app.router.add_post("/v1/completions", slow.completions)
    app.router.add_get("/readyz", slow.readyz)
    drain.install(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield slow, f"http://127.0.0.1:{port}"
    finally:
        slow.release.set()
        await runner.cleanup()


def test_a_drain_waits_for_the_completion_in_flight_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        async with serving() as (slow, url), aiohttp.ClientSession() as http:
            assert (await http.get(f"{url}/readyz")).status == 200
            in_flight = asyncio.create_task(http.post(f"{url}/v1/completions", json={"prompt": "x"}))
            await slow.started.wait()
            draining = asyncio.create_task(http.get(f"{url}/drain"))
            await asyncio.sleep(0.2)
            assert not draining.done(), "the drain answered with a completion still in flight"

            ready = await http.get(f"{url}/readyz")
            assert ready.status == 503 and (await ready.json())["status"] == "draining"
            refused = await http.post(f"{url}/v1/completions", json={"prompt": "y"})
            assert refused.status == 503 and refused.headers["Retry-After"] == "1"
            assert (await refused.json())["error"]["code"] == "draining"

            slow.release.set()
            finished = await in_flight
            assert finished.status == 200 and (await finished.json())["choices"][0]["text"] == "done"
            drained = await asyncio.wait_for(draining, 5)
            assert drained.status == 200 and (await drained.json())["status"] == "drained"

    asyncio.run(scenario())


def test_a_drain_with_a_timeout_gives_up_and_says_so() -> None:
    async def scenario() -> None:
        async with serving() as (slow, url), aiohttp.ClientSession() as http:
            in_flight = asyncio.create_task(http.post(f"{url}/v1/completions", json={}))
            await slow.started.wait()
            timed_out = await http.get(f"{url}/drain?timeout=0.2")
            assert timed_out.status == 503 and (await timed_out.json())["in_flight"] == 1
            bad = await http.get(f"{url}/drain?timeout=soon")
            assert bad.status == 400
            slow.release.set()
            assert (await in_flight).status == 200
            assert (await http.get(f"{url}/drain")).status == 200

    asyncio.run(scenario())


def test_an_idle_target_drains_at_once() -> None:
    async def scenario() -> None:
        async with serving() as (_, url), aiohttp.ClientSession() as http:
            response = await http.get(f"{url}/drain")
            assert response.status == 200 and (await response.json())["in_flight"] == 0

    asyncio.run(scenario())


def test_only_the_pod_itself_may_drain() -> None:
    """A drain takes the target out of service: a caller from another address is refused."""
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    async def scenario() -> None:
        app = web.Application()
        d = drain.install(app)
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (
            ("10.1.2.3", 40000) if name == "peername" else default
        )
        request = make_mocked_request("GET", "/drain", app=app, transport=transport)
        response = await d.handle(request)
        assert response.status == 403 and not d.draining

    asyncio.run(scenario())
