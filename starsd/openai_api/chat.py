"""``POST /v1/chat/completions``: the request contract (pure) and the chat template that turns messages into a
prompt (the checkpoint's, or the one given with ``--chat-template FILE``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import (
    COMMON_FIELDS,
    HARMLESS_FIELDS,
    GenerationRequest,
    Limits,
    check_fields,
    check_model,
    parse_generation,
)

ROLES = ("system", "developer", "user", "assistant")
# OpenAI's chat fields that cannot change the output when they hold these values (anything else: a 400).
_HARMLESS: dict[str, tuple[Any, ...]] = {
    "store": (None, False),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, False, True),
    "response_format": (None, {"type": "text"}),
}
CHAT_FIELDS = (
    COMMON_FIELDS
    | HARMLESS_FIELDS
    | set(_HARMLESS)
    | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "add_generation_prompt"}
)


@dataclass(frozen=True)
class ChatRequest(GenerationRequest):
    messages: tuple[dict[str, str], ...] = ()  # role and text content, in order
    add_generation_prompt: bool = True  # vLLM's: end the prompt where the assistant's answer starts


def parse_chat(body: Any, limits: Limits, served_models: tuple[str, ...]) -> ChatRequest:
    """Validate a decoded chat body; raise :class:`RequestError` naming the field on the first fault."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    check_model(body, served_models)
    check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    for name, allowed in _HARMLESS.items():
        if name in body and body[name] not in allowed:
            raise RequestError(f"'{name}' = {body[name]!r} is not supported by this server", param=name)
    fields = parse_generation(body, limits, served_models, ("max_completion_tokens", "max_tokens"))
    logprobs = body.get("logprobs", False)
    if logprobs is None:
        logprobs = False
    if not isinstance(logprobs, bool):
        raise RequestError("'logprobs' must be true or false", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= limits.max_logprobs:
            raise RequestError(f"'top_logprobs' must be an integer in 0..{limits.max_logprobs}", param="top_logprobs")
        if not logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise RequestError("'add_generation_prompt' must be true or false", param="add_generation_prompt")
    return ChatRequest(
        **fields,
        logprobs=(top or 0) if logprobs else None,
        messages=tuple(_parse_messages(body.get("messages"), limits)),
        add_generation_prompt=add_generation_prompt,
    )


def _parse_messages(messages: Any, limits: Limits) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of messages", param="messages")
    parsed = []
    total = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"'{where}' must be an object with 'role' and 'content'", param="messages")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(
                f"'{where}.role' must be one of {', '.join(ROLES)}; got {role!r} (tool calls are not supported)",
                param="messages",
            )
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise RequestError(f"'{where}.{extra[0]}' is not supported by this server", param="messages")
        content = _text(message.get("content"), where)
        total += len(content)
        if total > limits.max_prompt_chars:
            raise RequestError(f"'messages' hold more than {limits.max_prompt_chars} characters", param="messages")
        parsed.append({"role": "system" if role == "developer" else role, "content": content})
    return parsed


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (OpenAI's ``{"type": "text", "text": ...}``)."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and content:
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(
                    f"'{where}.content' parts must be {{'type': 'text', 'text': ...}} (this model reads text only)",
                    param="messages",
                )
            parts.append(part["text"])
        text = "\n".join(parts)
    else:
        raise RequestError(f"'{where}.content' must be a string or a list of text parts", param="messages")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"'{where}.content' holds an unpaired surrogate", param="messages") from None
    return text


def load_chat_template(path: Path | None) -> str | None:
    """The text of a ``--chat-template FILE`` (None: use the checkpoint's)."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the chat template {str(path)!r}: {exc.strerror}") from None


def render_chat(tokenizer: Any, req: ChatRequest, template: str | None) -> list[int]:
    """The prompt's token ids: the messages through the chat template (the checkpoint's unless ``template``)."""
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "this model has no chat template: start the target with --chat-template FILE, or use /v1/completions",
            param="messages",
            code="chat_template_missing",
        )
    try:
        text = tokenizer.apply_chat_template(
            list(req.messages),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=req.add_generation_prompt,
        )
    except Exception as exc:  # a template error (raise_exception, a missing variable) is the request's fault
        raise RequestError(f"the chat template failed on these messages: {exc}", param="messages") from None
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids
