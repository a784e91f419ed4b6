"""The target's HTTP server: OpenAI-compatible completions, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from starsd.sampling import SamplingParams
from starsd.target import drain
from starsd.target.api import (
    CompletionRequest,
    Limits,
    RequestError,
    check_context,
    find_stop,
    parse_completion,
    stop_check,
    stream_safe_length,
)
from starsd.target.engine import GenerationStats, TargetEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetServerOptions:
    target_id: str
    served_model: str
    max_concurrency: int = 64  # completions at once; more are answered 429 with Retry-After
    max_body_bytes: int = 1 << 20
    max_tokens_cap: int = 4096


def internal_error(exc: BaseException) -> RequestError:
    return RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, code="internal_error")


def _error(err: RequestError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=headers)


class TargetApp:
    def __init__(self, engine: TargetEngine, options: TargetServerOptions) -> None:
        self.engine = engine
        self.options = options
        loaded = engine.loaded
        self.limits = Limits(
            vocab_size=loaded.vocab_size,
            max_context=loaded.max_context,
            max_tokens_cap=options.max_tokens_cap,
        )
        self.active = 0
        self.started = int(time.time())

    def runner(self, shutdown_timeout: float = 30.0) -> web.AppRunner:
        """The app's runner. A client that disconnects cancels its handler (aiohttp does not by default), which
        stops its generation and frees its draft session within the round in progress."""
        return web.AppRunner(
            self.build(), access_log=None, shutdown_timeout=shutdown_timeout, handler_cancellation=True
        )

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        drain.install(app)  # GET /drain: the pod's preStop hook (readiness fails, in-flight completions finish)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as err:
            return _error(err)
        except web.HTTPRequestEntityTooLarge:
            return _error(RequestError(f"request body over {self.options.max_body_bytes} bytes", status=413))
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(RequestError(exc.reason or "error", status=exc.status))
            raise
        except Exception as exc:  # a bug must still answer in the API's shape, and the server keeps serving
            log.exception("internal error serving %s %s", request.method, request.path)
            return _error(internal_error(exc))

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _: web.Request) -> web.Response:
        draft = self.engine.draft
        return web.json_response(
            {
                "status": "ready",
                "draft_connected": bool(draft and draft.connected),
                "draft_error": (draft.last_error if draft and not draft.connected else ""),
                "draft_incompatible": bool(draft and draft.incompatible),
            }
        )

    async def metrics(self, _: web.Request) -> web.Response:
        draft = self.engine.draft
        self.engine.metrics.draft_connected.set(1 if draft and draft.connected else 0)
        body = generate_latest(self.engine.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, _: web.Request) -> web.Response:
        model = {
            "id": self.options.served_model,
            "object": "model",
            "created": self.started,
            "owned_by": "starsd",
            "max_model_len": self.limits.max_context,
            "starsd": {
                "device": str(self.engine.loaded.placement.device),
                "dtype": str(self.engine.loaded.placement.dtype).removeprefix("torch."),
                "max_num_seqs": self.engine.budget.max_num_seqs,
                "kv_cache_tokens": self.engine.budget.kv_tokens,
            },
        }
        return web.json_response({"object": "list", "data": [model]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        # Admission first: a full target refuses before it reads, parses or encodes anything, and the slot is held
        # while the prompt is encoded, so concurrent encodes are bounded by the same limit.
        if self.active >= self.options.max_concurrency:
            self.engine.metrics.requests.labels(status="429").inc()
            err = RequestError(
                f"this target is serving its maximum of {self.options.max_concurrency} completions; retry shortly",
                status=429,
                code="rate_limit_exceeded",
            )
            return _error(err, headers={"Retry-After": "1"})
        self.active += 1
        self.engine.metrics.active.set(self.active)
        try:
            try:
                body = await request.json(loads=json.loads)
            except RecursionError:
                raise RequestError("the request body is nested too deeply") from None
            except ValueError as exc:  # not JSON, not UTF-8, or an integer too long for Python to convert
                raise RequestError(f"the request body is not valid JSON: {exc}") from None
            req = parse_completion(body, self.limits, (self.options.served_model,))
            prompt_ids = await self._encode(req.prompt)
            if not prompt_ids:
                raise RequestError("the prompt encodes to no tokens", param="prompt")
            check_context(len(prompt_ids), req.max_tokens, self.limits)
            self._check_budget(len(prompt_ids), req.max_tokens)
            if req.stream:
                return await self._stream(request, req, prompt_ids)
            return await self._complete(req, prompt_ids)
        finally:
            self.active -= 1
            self.engine.metrics.active.set(self.active)

    def _check_budget(self, prompt_tokens: int, max_tokens: int) -> None:
        budget = self.engine.budget
        need = self.engine.reservation(prompt_tokens, max_tokens)
        if need > budget.kv_tokens:
            raise RequestError(
                f"this completion needs {need} key/value tokens (prompt {prompt_tokens} + max_tokens {max_tokens} "
                f"+ drafts) but this target's whole key/value budget is {budget.kv_tokens} tokens; "
                "send a shorter prompt or a smaller max_tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )

    async def _encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of the prompt. Encoding takes time in proportion to the text (about a second per MiB) and the
        tokenizer releases the GIL: run it on a worker thread, so other completions' rounds go on meanwhile."""
        if not isinstance(prompt, str):
            return prompt
        tokenizer = self.engine.loaded.tokenizer
        ids: list[int] = await asyncio.get_running_loop().run_in_executor(None, tokenizer.encode, prompt)
        return ids

    def _params(self, req: CompletionRequest) -> SamplingParams:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=req.seed)

    def _envelope(self, cid: str, text: str, finish: str | None) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.options.served_model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        }

    def _usage(self, prompt_ids: list[int], stats: GenerationStats) -> dict[str, Any]:
        return {
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": stats.generated_tokens,
                "total_tokens": len(prompt_ids) + stats.generated_tokens,
            },
            "starsd": {**stats.to_json(), "target": self.options.target_id, "token_ids": stats.token_ids},
        }

    async def _run(
        self, req: CompletionRequest, prompt_ids: list[int], stats: GenerationStats
    ) -> Any:  # AsyncIterator[tuple[str, bool]]: (text so far, finished by a stop sequence)
        tokenizer = self.engine.loaded.tokenizer
        stop = None
        if req.stop:
            stop = stop_check(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), req.stop)
        rounds = self.engine.generate(
            prompt_ids, req.max_tokens, self._params(req), stats, stop, ignore_eos=req.ignore_eos
        )
        async with aclosing(rounds):  # frees the draft session at once when a stop sequence ends early
            async for _ in rounds:
                text = tokenizer.decode(stats.token_ids, skip_special_tokens=True)
                cut = find_stop(text, req.stop) if req.stop else None
                if cut is not None:
                    stats.finish_reason = "stop"
                    yield text[:cut], True
                    return
                yield text, False

    async def _complete(self, req: CompletionRequest, prompt_ids: list[int]) -> web.Response:
        stats = GenerationStats()
        text = ""
        try:
            async for chunk, _ in self._run(req, prompt_ids, stats):
                text = chunk
        except asyncio.CancelledError:  # the client went away: the generation stops here
            self.engine.metrics.requests.labels(status="client_closed").inc()
            raise
        except Exception:
            self.engine.metrics.requests.labels(status="500").inc()
            raise
        self.engine.metrics.requests.labels(status="200").inc()
        body = self._envelope(f"cmpl-{uuid.uuid4().hex}", text, stats.finish_reason)
        body.update(self._usage(prompt_ids, stats))
        return web.json_response(body)

    async def _stream(self, request: web.Request, req: CompletionRequest, prompt_ids: list[int]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        cid = f"cmpl-{uuid.uuid4().hex}"
        stats = GenerationStats()
        sent = 0

        async def event(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        text = ""
        try:
            async for text, _ in self._run(req, prompt_ids, stats):
                safe = stream_safe_length(text, req.stop) if req.stop else len(text)
                safe = min(safe, len(text.rstrip("\ufffd")))  # an incomplete UTF-8 sequence waits for its rest
                if safe > sent:
                    await event(self._envelope(cid, text[sent:safe], None))
                    sent = safe
            final = self._envelope(cid, text[sent:], stats.finish_reason)
            if req.include_usage_in_stream:
                final.update(self._usage(prompt_ids, stats))
            await event(final)
            await event("[DONE]")
            self.engine.metrics.requests.labels(status="200").inc()
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.metrics.requests.labels(status="client_closed").inc()
            raise
        except Exception as exc:  # the headers are sent: the stream ends with an error event, then [DONE]
            log.exception("internal error in a streamed completion")
            self.engine.metrics.requests.labels(status="500").inc()
            await event(internal_error(exc).body())
            await event("[DONE]")
        await response.write_eof()
        return response
