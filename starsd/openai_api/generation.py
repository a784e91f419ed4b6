"""A request's choices run on the engine: one :class:`Choice` per prompt and ``n``, each driven through
``TargetEngine.generate`` round by round, and the non-streamed answer built when all have finished (the
streamed one is :mod:`starsd.openai_api.streaming`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from starsd.openai_api.detokenize import StopWatch
from starsd.openai_api.request import CompletionRequest, GenerationRequest
from starsd.openai_api.responses import Kind, chat_logprobs, choice, completion_logprobs, envelope
from starsd.openai_api.usage import usage_fields
from starsd.sampling import SamplingParams
from starsd.verifier.engine import GenerationStats, RequestControls, TargetEngine, choice_seed


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


@dataclass
class Completion:
    """One admitted request on its way: what it asked, its prompts and choices, and where it is answered from."""

    engine: TargetEngine
    kind: Kind
    req: GenerationRequest
    prompts: list[list[int]]
    choices: list[Choice]
    arrived: float  # perf_counter() when the request arrived
    model: str  # the served model's name, as answers show it
    target_id: str
    id: str = ""  # the answer's id (cmpl-... or chatcmpl-...), made when the completion is

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{'cmpl' if self.kind == 'text' else 'chatcmpl'}-{uuid.uuid4().hex}"


def make_choices(tokenizer: Any, req: GenerationRequest, prompts: list[list[int]]) -> list[Choice]:
    """``n`` choices per prompt, in OpenAI's order (prompt-major), each with its own seed and stop watch."""
    echo = isinstance(req, CompletionRequest) and req.echo
    choices = []
    for p, ids in enumerate(prompts):
        for j in range(req.n):
            watch = StopWatch(lambda t: tokenizer.decode(t, skip_special_tokens=True), req.stop)
            prefix = tokenizer.decode(ids, skip_special_tokens=True) if echo else ""
            choices.append(Choice(p * req.n + j, ids, choice_seed(req.seed, j), watch, prefix))
    return choices


def sampling_params(req: GenerationRequest, seed: int | None) -> SamplingParams:
    return SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=seed)


def request_controls(req: GenerationRequest) -> RequestControls:
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


def choice_logprobs(completion: Completion, c: Choice, start: int, end: int) -> dict[str, Any] | None:
    """The ``logprobs`` of the choice's tokens ``start..end`` (None when the request did not ask)."""
    if completion.req.logprobs is None:
        return None
    tokenizer = completion.engine.loaded.tokenizer

    def token_text(token: int) -> str:
        text: str = tokenizer.decode([token])
        return text

    ids, entries = c.stats.token_ids[start:end], c.stats.logprobs[start:end]
    if completion.kind == "chat":
        return chat_logprobs(ids, entries, token_text)
    ends = c.watch.detok.ends
    offsets = [len(c.prefix) + (ends[i - 1] if i else 0) for i in range(start, start + len(ids))]
    return completion_logprobs(ids, entries, offsets, token_text)


async def run_choice(completion: Completion, c: Choice) -> AsyncIterator[None]:
    """Run one choice; yields after every round that committed tokens (``c.stats`` and ``c.watch`` hold them)."""
    engine, req = completion.engine, completion.req
    rounds = engine.generate(
        c.prompt_ids,
        req.max_tokens,
        sampling_params(req, c.seed),
        c.stats,
        c.watch.check,
        controls=request_controls(req),
    )
    last = None
    async with aclosing(rounds):  # frees the draft session at once when a stop sequence ends early
        async for tokens in rounds:
            now = time.perf_counter()
            if last is not None:
                engine.metrics.inter_token(now - last, len(tokens))
            last = now
            yield


def record_finished(completion: Completion) -> None:
    metrics = completion.engine.metrics
    now = time.perf_counter()
    for c in completion.choices:
        s = c.stats
        metrics.finished(s.finish_reason, s.generated_tokens, completion.arrived, s.first_token_at, now)


async def complete(completion: Completion) -> web.Response:
    """The non-streamed answer: every choice generated at once, then one JSON body with ``usage`` and ``starsd``."""
    requests = completion.engine.metrics.requests

    async def run(c: Choice) -> None:
        async for _ in run_choice(completion, c):
            pass

    try:
        async with asyncio.TaskGroup() as group:
            for c in completion.choices:
                group.create_task(run(c))
    except asyncio.CancelledError:  # the client went away: the generation stops here
        requests.labels(status="client_closed").inc()
        raise
    except BaseExceptionGroup as group_error:
        requests.labels(status="500").inc()
        raise group_error.exceptions[0] from None
    requests.labels(status="200").inc()
    record_finished(completion)
    kind = completion.kind
    parts = [
        choice(
            kind,
            c.index,
            c.prefix + c.watch.text,
            c.stats.finish_reason,
            choice_logprobs(completion, c, 0, len(c.stats.token_ids)),
            chunk=False,
        )
        for c in completion.choices
    ]
    body = envelope(kind, completion.id, completion.model, parts, chunk=False)
    body.update(usage_fields(completion.prompts, [c.stats for c in completion.choices], completion.target_id))
    return web.json_response(body)
