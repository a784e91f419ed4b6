"""The OpenAI-compatible request contract of ``POST /v1/completions``: parsing and validation (pure).

Every rejection is a :class:`RequestError` carrying the HTTP status, a message that names the field, and the
OpenAI error ``type``/``code``, so existing clients show it as they would any API error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class RequestError(Exception):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        if self.status == 429:
            kind = "rate_limit_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one target accepts."""

    vocab_size: int
    max_context: int  # prompt + completion tokens
    max_tokens_cap: int = 4096  # the largest max_tokens accepted
    max_stop: int = 4  # OpenAI's limit on stop sequences
    max_stop_chars: int = 256
    max_prompt_chars: int = 1_000_000


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | list[int]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stream: bool = False
    stop: list[str] = field(default_factory=list)
    model: str | None = None
    include_usage_in_stream: bool = True
    ignore_eos: bool = False  # vLLM's extra: generate max_tokens even past the end-of-sequence token


# Fields whose non-default values would change what is generated in ways we do not support.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None, 0),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
}
# Accepted and ignored: they do not change the output.
_IGNORED = {"user", "stream_options"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise RequestError(f"'{name}' must be a number, got {type(value).__name__}", param=name)
    if not lo <= value <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {value}", param=name)
    return float(value)


def parse_completion(body: Any, limits: Limits, served_models: tuple[str, ...]) -> CompletionRequest:
    """Validate a decoded JSON body; raise :class:`RequestError` with a clear message on the first fault."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    if model is not None and model not in served_models:
        raise RequestError(
            f"the model '{model}' does not exist here; this server serves {', '.join(served_models)}",
            status=404,
            param="model",
            code="model_not_found",
        )
    for name, allowed in _UNSUPPORTED.items():
        if name in body and body[name] not in allowed:
            raise RequestError(f"'{name}' = {body[name]!r} is not supported by this server", param=name)

    prompt = _parse_prompt(body.get("prompt"), limits)

    max_tokens_raw = body.get("max_tokens", 16)
    if max_tokens_raw is None:
        max_tokens_raw = 16
    if not _is_int(max_tokens_raw):
        raise RequestError(f"'max_tokens' must be an integer, got {type(max_tokens_raw).__name__}", param="max_tokens")
    if max_tokens_raw < 1:
        raise RequestError(f"'max_tokens' must be at least 1, got {max_tokens_raw}", param="max_tokens")
    if max_tokens_raw > limits.max_tokens_cap:
        raise RequestError(
            f"'max_tokens' = {max_tokens_raw} exceeds this server's limit of {limits.max_tokens_cap}",
            param="max_tokens",
        )
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0.0:
        raise RequestError("'top_p' must be greater than 0", param="top_p")

    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise RequestError("'seed' must be an integer in [0, 2^63)", param="seed")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be true or false", param="stream")

    ignore_eos = body.get("ignore_eos", False)
    if ignore_eos is None:
        ignore_eos = False
    if not isinstance(ignore_eos, bool):
        raise RequestError("'ignore_eos' must be true or false", param="ignore_eos")

    stop = _parse_stop(body.get("stop"), limits)
    options = body.get("stream_options")
    include_usage = True
    if isinstance(options, dict) and isinstance(options.get("include_usage"), bool):
        include_usage = options["include_usage"]
    return CompletionRequest(
        prompt=prompt,
        max_tokens=max_tokens_raw,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stream=stream,
        stop=stop,
        model=model,
        include_usage_in_stream=include_usage,
        ignore_eos=ignore_eos,
    )


def _parse_prompt(prompt: Any, limits: Limits) -> str | list[int]:
    if prompt is None:
        raise RequestError("'prompt' is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("'prompt' must not be empty", param="prompt")
        if len(prompt) > limits.max_prompt_chars:
            raise RequestError(f"'prompt' is longer than {limits.max_prompt_chars} characters", param="prompt")
        if not prompt.isascii():
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError:  # JSON allows an unpaired \ud800-\udfff escape; text can not hold one
                message = "'prompt' holds an unpaired surrogate: it is not valid Unicode"
                raise RequestError(message, param="prompt") from None
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise RequestError("'prompt' must not be empty", param="prompt")
        if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
            raise RequestError("batched prompts are not supported: send one prompt per request", param="prompt")
        if not all(_is_int(t) for t in prompt):
            raise RequestError("a token-list 'prompt' must hold integers only", param="prompt")
        bad = [t for t in prompt if not 0 <= t < limits.vocab_size]
        if bad:
            raise RequestError(f"prompt token ids must be in 0..{limits.vocab_size - 1}; got {bad[:5]}", param="prompt")
        return list(prompt)
    raise RequestError("'prompt' must be a string or a list of token ids", param="prompt")


def _parse_stop(stop: Any, limits: Limits) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("'stop' must be a string or a list of strings", param="stop")
    if len(stop) > limits.max_stop:
        raise RequestError(f"at most {limits.max_stop} stop sequences", param="stop")
    if any(not s or len(s) > limits.max_stop_chars for s in stop):
        raise RequestError(f"stop sequences must be 1..{limits.max_stop_chars} characters", param="stop")
    return list(stop)


def check_context(prompt_tokens: int, max_tokens: int, limits: Limits) -> None:
    """The prompt and the completion must fit the model's context."""
    if prompt_tokens + max_tokens > limits.max_context:
        raise RequestError(
            f"this model's context is {limits.max_context} tokens; the prompt has {prompt_tokens} and "
            f"max_tokens asks for {max_tokens} more ({prompt_tokens + max_tokens} in all)",
            param="prompt" if prompt_tokens >= limits.max_context else "max_tokens",
            code="context_length_exceeded",
        )


def find_stop(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop sequence begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def stop_check(decode: Callable[[list[int]], str], stops: list[str]) -> Callable[[list[int], list[int]], int | None]:
    """A check for the generation loop: of a round's ``new`` tokens after ``before``, how many to keep because a
    stop sequence ends within them (the tokens up to and including the one that completes it), or None.

    Usage and ``token_ids`` then count the tokens up to the stop, as OpenAI and vLLM do.
    """

    def check(before: list[int], new: list[int]) -> int | None:
        if find_stop(decode(before + new), stops) is None:
            return None
        for k in range(1, len(new)):
            if find_stop(decode(before + new[:k]), stops) is not None:
                return k
        return len(new)

    return check


def stream_safe_length(text: str, stops: list[str]) -> int:
    """How much of ``text`` can be streamed without risking to emit the start of a stop sequence."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold
