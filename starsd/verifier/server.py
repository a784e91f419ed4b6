"""The target's HTTP server: OpenAI-compatible completions, health, readiness and metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from starsd import __version__, defaults
from starsd.sampling import SamplingParams
from starsd.verifier import auth, drain
from starsd.verifier.api import (
    CompletionRequest,
    GenerationRequest,
    Limits,
    RequestError,
    check_context,
    check_fields,
    check_model,
    parse_completion,
)
from starsd.verifier.chat import parse_chat, render_chat
from starsd.verifier.detokenize import StopWatch
from starsd.verifier.engine import GenerationStats, RequestControls, TargetEngine, choice_seed
from starsd.verifier.responses import Kind, chat_logprobs, choice, completion_logprobs, envelope, usage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetServerOptions:
    target_id: str
    served_model: str
    max_concurrency: int = defaults.TARGET_MAX_CONCURRENCY  # completions at once; more get 429 with Retry-After
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    max_tokens_cap: int = defaults.MAX_TOKENS_CAP
    chat_template: str | None = None  # overrides the checkpoint's (``--chat-template FILE``)
    # The accepted API keys (digests only); empty: every route is open (see starsd.verifier.auth).
    api_keys: auth.KeyRing = field(default_factory=auth.KeyRing)


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
        self.chat_template = options.chat_template
        engine.metrics.model_name = options.served_model

    def runner(self, shutdown_timeout: float = 30.0) -> web.AppRunner:
        """The app's runner. A client that disconnects cancels its handler (aiohttp does not by default), which
        stops its generation and frees its draft session within the round in progress."""
        return web.AppRunner(
            self.build(), access_log=None, shutdown_timeout=shutdown_timeout, handler_cancellation=True
        )

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/health", self.healthz)  # vLLM's name for liveness
        app.router.add_get("/version", self.version)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        drain.install(app)  # GET /drain: the pod's preStop hook (readiness fails, in-flight completions finish)
        if self.options.api_keys:  # first: a caller without a key learns nothing else (not even draining)
            app.middlewares.insert(0, auth.middleware(self.options.api_keys, self.engine.metrics.unauthorized))
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
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

    def _draft_status(self) -> dict[str, Any]:
        """The draft link as /readyz and /v1/models report it: whether it is up, the draft in use and its rank
        in this target's order (0: the first choice), and the whole order."""
        draft = self.engine.draft
        connected = bool(draft and draft.connected)
        return {
            "draft_connected": connected,
            "draft_error": (draft.last_error if draft and not draft.connected else ""),
            "draft_incompatible": bool(draft and draft.incompatible),
            "draft_address": draft.address if draft and connected else "",
            "draft_rank": draft.rank if draft else None,
            "drafts": list(draft.addresses) if draft else [],
            # With --drafts-from: where the drafts are found, and why the last lookup failed ("" if it did not).
            "drafts_from": draft.drafts_from if draft else "",
            "drafts_error": draft.discovery_error if draft else "",
        }

    async def readyz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ready", **self._draft_status()})

    async def metrics(self, _: web.Request) -> web.Response:
        draft = self.engine.draft
        self.engine.metrics.draft_connected.set(1 if draft and draft.connected else 0)
        rank = draft.rank if draft else None
        self.engine.metrics.draft_rank.set(-1 if rank is None else rank)
        self.engine.metrics.drafts_found.set(len(draft.addresses) if draft else 0)
        self.engine.metrics.drafts_lookup_failing.set(1 if draft and draft.discovery_error else 0)
        self.engine.metrics.scheduler_state(self.engine.budget.running, self.engine.budget.waiting)
        body = generate_latest(self.engine.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    def _model_card(self) -> dict[str, Any]:
        return {
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
                **self._draft_status(),
            },
        }

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.options.served_model:
            raise RequestError(
                f"the model '{name}' does not exist here; this server serves {self.options.served_model}",
                status=404,
                param="model",
                code="model_not_found",
            )
        return web.json_response(self._model_card())

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": __version__})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        check_model(body, (self.options.served_model,))
        if "messages" in body:
            check_fields(body, {"model", "messages", "add_generation_prompt"}, "/tokenize")
            chat = parse_chat(body, self.limits, (self.options.served_model,))
            ids = render_chat(self.engine.loaded.tokenizer, chat, self.chat_template)
        else:
            check_fields(body, {"model", "prompt", "add_special_tokens"}, "/tokenize")
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise RequestError("'prompt' must be a string (or send 'messages')", param="prompt")
            add_special = body.get("add_special_tokens", True)
            if not isinstance(add_special, bool):
                raise RequestError("'add_special_tokens' must be true or false", param="add_special_tokens")
            ids = await self._encode(prompt, add_special) if prompt else []
        return web.json_response({"count": len(ids), "max_model_len": self.limits.max_context, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        check_model(body, (self.options.served_model,))
        check_fields(body, {"model", "tokens"}, "/detokenize")
        tokens = body.get("tokens")
        vocab = self.limits.vocab_size
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
        ):
            raise RequestError(f"'tokens' must be a list of token ids in 0..{vocab - 1}", param="tokens")
        return web.json_response({"prompt": self.engine.loaded.tokenizer.decode(tokens)})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "text")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json(loads=json.loads)
        except RecursionError:
            raise RequestError("the request body is nested too deeply") from None
        except ValueError as exc:  # not JSON, not UTF-8, or an integer too long for Python to convert
            raise RequestError(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    async def _serve(self, request: web.Request, kind: Kind) -> web.StreamResponse:
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
        arrived = time.perf_counter()
        self.active += 1
        self.engine.metrics.active.set(self.active)
        try:
            body = await self._json(request)
            served = (self.options.served_model,)
            req: GenerationRequest
            if kind == "text":
                req = parse_completion(body, self.limits, served)
                prompts = [await self._encode(p) for p in req.prompts]
            else:
                req = parse_chat(body, self.limits, served)
                tokenizer = self.engine.loaded.tokenizer
                render = functools.partial(render_chat, tokenizer, req, self.chat_template)
                prompts = [await asyncio.get_running_loop().run_in_executor(None, render)]
            if any(not ids for ids in prompts):
                raise RequestError("the prompt encodes to no tokens", param="prompt")
            longest = max(len(ids) for ids in prompts)
            if req.max_tokens_default:  # chat without a limit: what the context leaves
                req = dataclasses.replace(
                    req, max_tokens=max(1, min(req.max_tokens, self.limits.max_context - longest))
                )
            for ids in prompts:
                check_context(len(ids), req.max_tokens, self.limits)
                self._check_budget(len(ids), req.max_tokens)
            choices = self._choices(req, prompts)
            self.engine.metrics.prompt_tokens(sum(len(ids) for ids in prompts))
            if req.stream:
                return await self._stream(request, kind, req, prompts, choices, arrived)
            return await self._complete(kind, req, prompts, choices, arrived)
        finally:
            self.active -= 1
            self.engine.metrics.active.set(self.active)

    def _choices(self, req: GenerationRequest, prompts: list[list[int]]) -> list[Choice]:
        tokenizer = self.engine.loaded.tokenizer
        echo = isinstance(req, CompletionRequest) and req.echo
        choices = []
        for p, ids in enumerate(prompts):
            for j in range(req.n):
                watch = StopWatch(lambda t: tokenizer.decode(t, skip_special_tokens=True), req.stop)
                prefix = tokenizer.decode(ids, skip_special_tokens=True) if echo else ""
                choices.append(Choice(p * req.n + j, ids, choice_seed(req.seed, j), watch, prefix))
        return choices

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

    async def _encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """Token ids of the prompt. Encoding takes time in proportion to the text (about a second per MiB) and the
        tokenizer releases the GIL: run it on a worker thread, so other completions' rounds go on meanwhile."""
        if not isinstance(prompt, str):
            return prompt
        tokenizer = self.engine.loaded.tokenizer
        encode = tokenizer.encode
        if not add_special_tokens:
            encode = functools.partial(tokenizer.encode, add_special_tokens=False)
        ids: list[int] = await asyncio.get_running_loop().run_in_executor(None, encode, prompt)
        return ids

    @staticmethod
    def _params(req: GenerationRequest, seed: int | None) -> SamplingParams:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=seed)

    @staticmethod
    def _controls(req: GenerationRequest) -> RequestControls:
        return RequestControls(
            ignore_eos=req.ignore_eos,
            stop_token_ids=req.stop_token_ids,
            min_tokens=req.min_tokens,
            top_k=req.top_k,
            logit_bias=req.logit_bias,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            logprobs=req.logprobs,
        )

    def _token_text(self, token: int) -> str:
        text: str = self.engine.loaded.tokenizer.decode([token])
        return text

    def _logprobs(self, kind: Kind, req: GenerationRequest, c: Choice, start: int, end: int) -> dict[str, Any] | None:
        """The ``logprobs`` of the choice's tokens ``start..end`` (None when the request did not ask)."""
        if req.logprobs is None:
            return None
        ids, entries = c.stats.token_ids[start:end], c.stats.logprobs[start:end]
        if kind == "chat":
            return chat_logprobs(ids, entries, self._token_text)
        ends = c.watch.detok.ends
        offsets = [len(c.prefix) + (ends[i - 1] if i else 0) for i in range(start, start + len(ids))]
        return completion_logprobs(ids, entries, offsets, self._token_text)

    async def _generate(self, req: GenerationRequest, c: Choice) -> AsyncIterator[None]:
        """Run one choice; yields after every round that committed tokens (``c.stats`` and ``c.watch`` hold them)."""
        metrics = self.engine.metrics
        rounds = self.engine.generate(
            c.prompt_ids,
            req.max_tokens,
            self._params(req, c.seed),
            c.stats,
            c.watch.check,
            controls=self._controls(req),
        )
        last = None
        async with aclosing(rounds):  # frees the draft session at once when a stop sequence ends early
            async for tokens in rounds:
                now = time.perf_counter()
                if last is not None:
                    metrics.inter_token(now - last, len(tokens))
                last = now
                yield

    def _finished(self, choices: list[Choice], arrived: float) -> None:
        metrics = self.engine.metrics
        now = time.perf_counter()
        for c in choices:
            metrics.finished(c.stats.finish_reason, c.stats.generated_tokens, arrived, c.stats.first_token_at, now)

    def _usage(self, prompts: list[list[int]], choices: list[Choice]) -> dict[str, Any]:
        generated = sum(c.stats.generated_tokens for c in choices)
        totals = GenerationStats()
        for c in choices:
            for key, value in c.stats.to_json().items():
                setattr(totals, key, getattr(totals, key) + value)
        extra: dict[str, Any] = {**totals.to_json(), "target": self.options.target_id}
        if len(choices) == 1:
            extra["token_ids"] = choices[0].stats.token_ids
        else:
            extra["choices"] = [
                {"index": c.index, **c.stats.to_json(), "token_ids": c.stats.token_ids} for c in choices
            ]
        return {"usage": usage(sum(len(p) for p in prompts), generated), "starsd": extra}

    async def _complete(
        self, kind: Kind, req: GenerationRequest, prompts: list[list[int]], choices: list[Choice], arrived: float
    ) -> web.Response:
        async def run(c: Choice) -> None:
            async for _ in self._generate(req, c):
                pass

        try:
            async with asyncio.TaskGroup() as group:
                for c in choices:
                    group.create_task(run(c))
        except asyncio.CancelledError:  # the client went away: the generation stops here
            self.engine.metrics.requests.labels(status="client_closed").inc()
            raise
        except BaseExceptionGroup as group_error:
            self.engine.metrics.requests.labels(status="500").inc()
            raise group_error.exceptions[0] from None
        self.engine.metrics.requests.labels(status="200").inc()
        self._finished(choices, arrived)
        prefix = "cmpl" if kind == "text" else "chatcmpl"
        body = envelope(
            kind,
            f"{prefix}-{uuid.uuid4().hex}",
            self.options.served_model,
            [
                choice(
                    kind,
                    c.index,
                    c.prefix + c.watch.text,
                    c.stats.finish_reason,
                    self._logprobs(kind, req, c, 0, len(c.stats.token_ids)),
                    chunk=False,
                )
                for c in choices
            ],
            chunk=False,
        )
        body.update(self._usage(prompts, choices))
        return web.json_response(body)

    async def _stream(
        self,
        request: web.Request,
        kind: Kind,
        req: GenerationRequest,
        prompts: list[list[int]],
        choices: list[Choice],
        arrived: float,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        cid = f"{'cmpl' if kind == 'text' else 'chatcmpl'}-{uuid.uuid4().hex}"
        model = self.options.served_model
        lock = asyncio.Lock()

        async def event(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            async with lock:
                await response.write(f"data: {data}\n\n".encode())

        async def send(c: Choice, text: str, finish: str | None, first: bool = False) -> None:
            start, end = c.reported, len(c.stats.token_ids)
            logprobs = None if first else self._logprobs(kind, req, c, start, end)
            c.reported = end if not first else c.reported
            part = choice(kind, c.index, text, finish, logprobs, chunk=True, first=first)
            await event(envelope(kind, cid, model, [part], chunk=True))

        async def run(c: Choice) -> None:
            if kind == "chat":
                await send(c, "", None, first=True)
            elif c.prefix:
                await send(c, c.prefix, None)
            async for _ in self._generate(req, c):
                safe = c.watch.streamable()
                if safe > c.sent:
                    await send(c, c.watch.text[c.sent : safe], None)
                    c.sent = safe
            await send(c, c.watch.text[c.sent :], c.stats.finish_reason)

        try:
            try:
                async with asyncio.TaskGroup() as group:
                    for c in choices:
                        group.create_task(run(c))
            except BaseExceptionGroup as group_error:
                raise group_error.exceptions[0] from None
            self._finished(choices, arrived)
            if req.include_usage_in_stream:
                final = envelope(kind, cid, model, [], chunk=True)
                final.update(self._usage(prompts, choices))
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


@dataclass
class Choice:
    """One choice of a request while it is generated: its prompt, seed, statistics and text."""

    index: int
    prompt_ids: list[int]
    seed: int | None
    watch: StopWatch
    prefix: str = ""  # echo: the prompt's text before the completion's
    stats: GenerationStats = field(default_factory=GenerationStats)
    sent: int = 0  # characters of watch.text streamed
    reported: int = 0  # tokens whose logprobs were streamed
