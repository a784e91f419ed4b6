"""The streamed answer (``"stream": true``): server-sent events, one chunk per choice per round that adds text
(held back while it could be the start of a stop sequence), a final usage chunk when asked, then ``[DONE]``.

Once the headers are sent a failure can no longer change the status: the stream then ends with an error event
in OpenAI's shape, and ``[DONE]``."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from starsd.openai_api.errors import internal_error
from starsd.openai_api.generation import Choice, Completion, choice_logprobs, record_finished, run_choice
from starsd.openai_api.responses import choice, envelope
from starsd.openai_api.usage import usage_fields

log = logging.getLogger(__name__)


async def stream(request: web.Request, completion: Completion) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    kind, requests = completion.kind, completion.engine.metrics.requests
    lock = asyncio.Lock()

    async def event(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        async with lock:
            await response.write(f"data: {data}\n\n".encode())

    async def send(c: Choice, text: str, finish: str | None, first: bool = False) -> None:
        start, end = c.reported, len(c.stats.token_ids)
        logprobs = None if first else choice_logprobs(completion, c, start, end)
        c.reported = end if not first else c.reported
        part = choice(kind, c.index, text, finish, logprobs, chunk=True, first=first)
        await event(envelope(kind, completion.id, completion.model, [part], chunk=True))

    async def run(c: Choice) -> None:
        if kind == "chat":
            await send(c, "", None, first=True)
        elif c.prefix:
            await send(c, c.prefix, None)
        async for _ in run_choice(completion, c):
            safe = c.watch.streamable()
            if safe > c.sent:
                await send(c, c.watch.text[c.sent : safe], None)
                c.sent = safe
        await send(c, c.watch.text[c.sent :], c.stats.finish_reason)

    try:
        try:
            async with asyncio.TaskGroup() as group:
                for c in completion.choices:
                    group.create_task(run(c))
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
        record_finished(completion)
        if completion.req.include_usage_in_stream:
            final = envelope(kind, completion.id, completion.model, [], chunk=True)
            final.update(usage_fields(completion.prompts, [c.stats for c in completion.choices], completion.target_id))
            await event(final)
        await event("[DONE]")
        requests.labels(status="200").inc()
    except (ConnectionResetError, asyncio.CancelledError):
        requests.labels(status="client_closed").inc()
        raise
    except Exception as exc:  # the headers are sent: the stream ends with an error event, then [DONE]
        log.exception("internal error in a streamed completion")
        requests.labels(status="500").inc()
        await event(internal_error(exc).body())
        await event("[DONE]")
    await response.write_eof()
    return response
