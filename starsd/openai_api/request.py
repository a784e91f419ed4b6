"""The OpenAI-compatible request contract of ``POST /v1/completions``: parsing and validation (pure; the chat
endpoint's own fields are in :mod:`starsd.openai_api.chat`).

Every rejection is a :class:`~starsd.openai_api.errors.RequestError` carrying the HTTP status, a message that
names the field, and the OpenAI error ``type``/``code``, so existing clients show it as they would any API
error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from starsd import defaults
from starsd.openai_api.errors import RequestError


@dataclass(frozen=True)
class Limits:
    """What one target accepts."""

    vocab_size: int
    max_context: int  # prompt + completion tokens
    max_tokens_cap: int = defaults.MAX_TOKENS_CAP  # the largest max_tokens accepted
    max_stop: int = 4  # OpenAI's limit on stop sequences
    max_stop_chars: int = 256
    max_prompt_chars: int = 1_000_000
    max_n: int = 64  # choices in one request (prompts x n)
    max_logprobs: int = 20  # top alternatives reported per token (vLLM's default limit)
    max_logit_bias: int = 300  # OpenAI's limit


@dataclass(frozen=True)
class GenerationRequest:
    """What ``/v1/completions`` and ``/v1/chat/completions`` share: how to generate, how many, what to report."""

    max_tokens: int = 16
    max_tokens_default: bool = False  # not given (chat): as many as the context leaves, up to max_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stream: bool = False
    stop: list[str] = field(default_factory=list)
    model: str | None = None
    include_usage_in_stream: bool = False  # OpenAI: a final usage chunk only with stream_options.include_usage
    n: int = 1  # independent completions per prompt
    logprobs: int | None = None  # the target's log-probabilities of the emitted tokens, and this many alternatives
    # vLLM's extras
    ignore_eos: bool = False  # generate max_tokens even past the end-of-sequence token
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    top_k: int = 0  # 0: all tokens (vLLM's -1 is read as 0)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    prompts: tuple[str | list[int], ...] = ("",)  # a batch: one choice (n choices) per prompt
    echo: bool = False

    @property
    def prompt(self) -> str | list[int]:
        return self.prompts[0]


# Fields whose non-default values would change what is generated in ways we do not support.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
}
# Accepted and ignored: they do not change the output.
HARMLESS_FIELDS = {"user", "metadata"}
# The fields every generation endpoint reads (the others are endpoint-specific).
COMMON_FIELDS = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stream",
    "stream_options",
    "stop",
    "n",
    "best_of",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "ignore_eos",
    "stop_token_ids",
    "min_tokens",
    "top_k",
    "repetition_penalty",
}
COMPLETION_FIELDS = COMMON_FIELDS | HARMLESS_FIELDS | set(_UNSUPPORTED) | {"prompt", "echo", "logprobs"}


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


def _integer(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise RequestError(f"'{name}' must be an integer, got {type(value).__name__}", param=name)
    if not lo <= value <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {value}", param=name)
    return int(value)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false", param=name)
    return value


def check_fields(body: dict[str, Any], known: set[str], endpoint: str) -> None:
    """Refuse a field this server does not know: it might change the output, and nothing is silently ignored."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise RequestError(f"'{unknown[0]}' is not supported by {endpoint} on this server", param=unknown[0])


def check_model(body: dict[str, Any], served_models: tuple[str, ...]) -> str | None:
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
    return model


def parse_generation(
    body: dict[str, Any], limits: Limits, served_models: tuple[str, ...], max_tokens_names: tuple[str, ...]
) -> dict[str, Any]:
    """The :class:`GenerationRequest` fields of ``body`` (``max_tokens_names``: the fields that may set
    max_tokens, the first present wins), validated; the caller adds its endpoint's own."""
    model = check_model(body, served_models)
    for name, allowed in _UNSUPPORTED.items():
        if name in body and body[name] not in allowed:
            raise RequestError(f"'{name}' = {body[name]!r} is not supported by this server", param=name)
    max_tokens = _max_tokens(body, limits, max_tokens_names)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0.0:
        raise RequestError("'top_p' must be greater than 0", param="top_p")

    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise RequestError("'seed' must be an integer in [0, 2^63)", param="seed")
    stream = _flag(body, "stream")
    n = _integer(body, "n", 1, 1, limits.max_n)
    best_of = _integer(body, "best_of", n, 1, limits.max_n)
    if best_of != n:
        raise RequestError(
            f"'best_of' = {best_of} is not supported: it must equal n ({n}), as when streaming", param="best_of"
        )
    top_k = _integer(body, "top_k", 0, -1, limits.vocab_size)
    min_tokens = _integer(body, "min_tokens", 0, 0, max_tokens)
    return {
        "max_tokens": max_tokens,
        "max_tokens_default": all(body.get(n) is None for n in max_tokens_names) and len(max_tokens_names) > 1,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "stream": stream,
        "stop": _parse_stop(body.get("stop"), limits),
        "model": model,
        "include_usage_in_stream": _stream_options(body, stream),
        "n": n,
        "ignore_eos": _flag(body, "ignore_eos"),
        "stop_token_ids": _token_ids(body, "stop_token_ids", limits),
        "min_tokens": min_tokens,
        "top_k": max(top_k, 0),
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": _repetition_penalty(body),
        "logit_bias": _logit_bias(body.get("logit_bias"), limits),
    }


def parse_completion(body: Any, limits: Limits, served_models: tuple[str, ...]) -> CompletionRequest:
    """Validate a decoded JSON body; raise :class:`RequestError` with a clear message on the first fault."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    check_model(body, served_models)
    check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    fields = parse_generation(body, limits, served_models, ("max_tokens",))
    prompts = _parse_prompts(body.get("prompt"), limits)
    if len(prompts) * fields["n"] > limits.max_n:
        raise RequestError(
            f"{len(prompts)} prompts x n = {fields['n']} asks for more than this server's {limits.max_n} choices",
            param="n",
        )
    echo = _flag(body, "echo")
    logprobs = _integer(body, "logprobs", -1, 0, limits.max_logprobs) if body.get("logprobs") is not None else None
    if echo and logprobs is not None:
        raise RequestError(
            "'echo' with 'logprobs' would need the prompt's log-probabilities, which this server does not compute",
            param="echo",
        )
    return CompletionRequest(**fields, logprobs=logprobs, prompts=tuple(prompts), echo=echo)


def _max_tokens(body: dict[str, Any], limits: Limits, names: tuple[str, ...]) -> int:
    name = next((n for n in names if body.get(n) is not None), names[0])
    value = body.get(name)
    if value is None:  # chat: as much as the context leaves (see GenerationRequest.max_tokens_default)
        return 16 if len(names) == 1 else limits.max_tokens_cap
    if not _is_int(value):
        raise RequestError(f"'{name}' must be an integer, got {type(value).__name__}", param=name)
    if value < 1:
        raise RequestError(f"'{name}' must be at least 1, got {value}", param=name)
    if value > limits.max_tokens_cap:
        raise RequestError(f"'{name}' = {value} exceeds this server's limit of {limits.max_tokens_cap}", param=name)
    return int(value)


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise RequestError("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    extra = sorted(set(options) - {"include_usage", "continuous_usage_stats"})
    if extra:
        raise RequestError(f"'stream_options.{extra[0]}' is not supported", param="stream_options")
    if options.get("continuous_usage_stats"):
        raise RequestError("'stream_options.continuous_usage_stats' is not supported", param="stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise RequestError("'stream_options.include_usage' must be true or false", param="stream_options")
    return usage


def _token_ids(body: dict[str, Any], name: str, limits: Limits) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t < limits.vocab_size for t in value):
        raise RequestError(f"'{name}' must be a list of token ids in 0..{limits.vocab_size - 1}", param=name)
    return tuple(value)


def _repetition_penalty(body: dict[str, Any]) -> float:
    value = _number(body, "repetition_penalty", 1.0, 0.0, 2.0)
    if value <= 0.0:
        raise RequestError("'repetition_penalty' must be greater than 0", param="repetition_penalty")
    return value


def _logit_bias(value: Any, limits: Limits) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("'logit_bias' must be an object of token id -> bias", param="logit_bias")
    if len(value) > limits.max_logit_bias:
        raise RequestError(f"'logit_bias' may hold at most {limits.max_logit_bias} entries", param="logit_bias")
    bias: dict[int, float] = {}
    for key, b in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() and len(key) < 12 else -1
        if not 0 <= token < limits.vocab_size:
            raise RequestError(
                f"'logit_bias' keys must be token ids in 0..{limits.vocab_size - 1}, got {key!r}", param="logit_bias"
            )
        if not _is_number(b) or not -100 <= b <= 100:
            raise RequestError(f"'logit_bias' values must be numbers in [-100, 100], got {b!r}", param="logit_bias")
        bias[token] = float(b)
    return bias


def _parse_prompts(prompt: Any, limits: Limits) -> list[str | list[int]]:
    """One prompt, or a batch: a list of strings or a list of token lists."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if not (all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt)):
            raise RequestError("a batch of prompts must be all strings or all token lists", param="prompt")
        if len(prompt) > limits.max_n:
            raise RequestError(f"at most {limits.max_n} prompts in one request", param="prompt")
        return [_parse_prompt(p, limits) for p in prompt]
    return [_parse_prompt(prompt, limits)]


def _parse_prompt(prompt: Any, limits: Limits) -> str | list[int]:
    if prompt is None:
        raise RequestError("'prompt' is required", param="prompt")
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
        if any(isinstance(p, str | list) for p in prompt):
            raise RequestError("a batch of prompts must be all strings or all token lists", param="prompt")
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
