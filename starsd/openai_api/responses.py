"""The shapes of OpenAI's answers (pure): completions and chat completions, whole and as stream chunks.

``text_completion`` / ``chat.completion`` bodies, their ``.chunk`` stream events, ``usage``, and log-probabilities
in each endpoint's own format (completions: ``tokens`` / ``token_logprobs`` / ``top_logprobs`` /
``text_offset``; chat: ``content: [{token, logprob, bytes, top_logprobs}]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from starsd.verifier.runner import TokenLogprobs

Kind = Literal["text", "chat"]
TokenText = Callable[[int], str]  # the text of one token id, as logprobs show it


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def envelope(kind: Kind, cid: str, model: str, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
    obj = "text_completion" if kind == "text" else ("chat.completion.chunk" if chunk else "chat.completion")
    return {"id": cid, "object": obj, "created": int(time.time()), "model": model, "choices": choices}


def completion_logprobs(
    token_ids: list[int], entries: list[TokenLogprobs], offsets: list[int], token_text: TokenText
) -> dict[str, Any]:
    """Completions' ``logprobs`` object for ``token_ids`` whose text starts at ``offsets``."""
    return {
        "tokens": [token_text(t) for t in token_ids],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{token_text(t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def _chat_token(token: int, logprob: float, token_text: TokenText) -> dict[str, Any]:
    text = token_text(token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(token_ids: list[int], entries: list[TokenLogprobs], token_text: TokenText) -> dict[str, Any]:
    """Chat's ``logprobs`` object: one entry per token, each with its top alternatives."""
    return {
        "content": [
            {
                **_chat_token(t, e.logprob, token_text),
                "top_logprobs": [_chat_token(alt, lp, token_text) for alt, lp in e.top],
            }
            for t, e in zip(token_ids, entries, strict=True)
        ]
    }


def choice(
    kind: Kind,
    index: int,
    text: str,
    finish: str | None,
    logprobs: dict[str, Any] | None,
    chunk: bool,
    first: bool = False,
) -> dict[str, Any]:
    """One choice of a body (``chunk`` False) or of a stream chunk; ``first``: a chat stream's role chunk."""
    if kind == "text":
        return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}
    if not chunk:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
    delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
    if text and not first:
        delta["content"] = text
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
