"""The target's HTTP server: the routes (OpenAI's completions, chat completions and models, vLLM's tokenize and
detokenize, health, readiness, metrics, drain) and the middleware that answers every error in OpenAI's shape.

A completion goes through :func:`starsd.openai_api.admission.admit` (parse, encode, check), then
:func:`starsd.openai_api.generation.complete` or :func:`starsd.openai_api.streaming.stream`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from starsd import __version__, defaults
from starsd.openai_api import admission, auth, drain
from starsd.openai_api.chat import parse_chat, render_chat
from starsd.openai_api.errors import RequestError, internal_error
from starsd.openai_api.generation import Completion, complete, make_choices
from starsd.openai_api.request import Limits, check_fields, check_model
from starsd.openai_api.responses import Kind
from starsd.openai_api.streaming import stream
from starsd.verifier.engine import TargetEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetServerOptions:
    target_id: str
    served_model: str
    max_concurrency: int = defaults.TARGET_MAX_CONCURRENCY  # completions at once; more get 429 with Retry-After
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    max_tokens_cap: int = defaults.MAX_TOKENS_CAP
    chat_template: str | None = None  # overrides the checkpoint's (``--chat-template FILE``)
    # The accepted API keys (digests only); empty: every route is open (see starsd.openai_api.auth).
    api_keys: auth.KeyRing = field(default_factory=auth.KeyRing)


def _error(err: RequestError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers or None)


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
        body = await admission.read_json(request)
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
            ids = await admission.encode(self.engine.loaded.tokenizer, prompt, add_special) if prompt else []
        return web.json_response({"count": len(ids), "max_model_len": self.limits.max_context, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await admission.read_json(request)
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

    async def _serve(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        # Admission first: a full target refuses before it reads, parses or encodes anything, and the slot is held
        # while the prompt is encoded, so concurrent encodes are bounded by the same limit.
        metrics = self.engine.metrics
        if self.active >= self.options.max_concurrency:
            metrics.requests.labels(status="429").inc()
            return _error(admission.busy(self.options.max_concurrency))
        arrived = time.perf_counter()
        self.active += 1
        metrics.active.set(self.active)
        try:
            body = await admission.read_json(request)
            options = self.options
            req, prompts = await admission.admit(
                body, kind, self.engine, self.limits, options.served_model, self.chat_template
            )
            choices = make_choices(self.engine.loaded.tokenizer, req, prompts)
            metrics.prompt_tokens(sum(len(ids) for ids in prompts))
            completion = Completion(
                self.engine, kind, req, prompts, choices, arrived, options.served_model, options.target_id
            )
            return await (stream(request, completion) if req.stream else complete(completion))
        finally:
            self.active -= 1
            metrics.active.set(self.active)
