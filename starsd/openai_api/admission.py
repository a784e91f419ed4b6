"""From an HTTP request to what the engine runs: the body read as JSON, parsed, the prompts encoded, and the
context and key/value budget checked before anything is generated. Every refusal is a ``RequestError``."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from typing import Any

from aiohttp import web

from starsd.openai_api.chat import parse_chat, render_chat
from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import GenerationRequest, Limits, check_context, parse_completion
from starsd.openai_api.responses import Kind
from starsd.verifier.engine import TargetEngine


def busy(max_concurrency: int) -> RequestError:
    """A full target's answer: 429 with ``Retry-After``, before it reads, parses or encodes anything."""
    return RequestError(
        f"this target is serving its maximum of {max_concurrency} completions; retry shortly",
        status=429,
        code="rate_limit_exceeded",
        headers={"Retry-After": "1"},
    )


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer too long for Python to convert
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


async def encode(tokenizer: Any, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
    """Token ids of the prompt. Encoding takes time in proportion to the text (about a second per MiB) and the
    tokenizer releases the GIL: run it on a worker thread, so other completions' rounds go on meanwhile."""
    if not isinstance(prompt, str):
        return prompt
    encoder = tokenizer.encode
    if not add_special_tokens:
        encoder = functools.partial(tokenizer.encode, add_special_tokens=False)
    ids: list[int] = await asyncio.get_running_loop().run_in_executor(None, encoder, prompt)
    return ids


def check_budget(engine: TargetEngine, prompt_tokens: int, max_tokens: int) -> None:
    budget = engine.budget
    need = engine.reservation(prompt_tokens, max_tokens)
    if need > budget.kv_tokens:
        raise RequestError(
            f"this completion needs {need} key/value tokens (prompt {prompt_tokens} + max_tokens {max_tokens} "
            f"+ drafts) but this target's whole key/value budget is {budget.kv_tokens} tokens; "
            "send a shorter prompt or a smaller max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


async def admit(
    body: dict[str, Any],
    kind: Kind,
    engine: TargetEngine,
    limits: Limits,
    served_model: str,
    chat_template: str | None,
) -> tuple[GenerationRequest, list[list[int]]]:
    """The parsed request and its prompts' token ids, once the context and the key/value budget allow them."""
    served = (served_model,)
    tokenizer = engine.loaded.tokenizer
    req: GenerationRequest
    if kind == "text":
        req = parse_completion(body, limits, served)
        prompts = [await encode(tokenizer, p) for p in req.prompts]
    else:
        req = parse_chat(body, limits, served)
        render = functools.partial(render_chat, tokenizer, req, chat_template)
        prompts = [await asyncio.get_running_loop().run_in_executor(None, render)]
    if any(not ids for ids in prompts):
        raise RequestError("the prompt encodes to no tokens", param="prompt")
    longest = max(len(ids) for ids in prompts)
    if req.max_tokens_default:  # chat without a limit: what the context leaves
        req = dataclasses.replace(req, max_tokens=max(1, min(req.max_tokens, limits.max_context - longest)))
    for ids in prompts:
        check_context(len(ids), req.max_tokens, limits)
        check_budget(engine, len(ids), req.max_tokens)
    return req, prompts
