"""The chat request contract and the chat template: what is accepted, the 400 naming what is not, and the
prompt the template makes (the checkpoint's, or --chat-template's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from starsd.openai_api.chat import load_chat_template, parse_chat, render_chat
from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import Limits
from starsd.vocab import load_tokenizer

LIMITS = Limits(vocab_size=100, max_context=64, max_tokens_cap=50)
USER = [{"role": "user", "content": "hi"}]


def parse(body: dict[str, Any]) -> Any:
    return parse_chat(body, LIMITS, ("target",))


def test_messages_parts_and_openais_fields_are_read() -> None:
    req = parse(
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "ok", "name": "bot"},
            ],
            "max_completion_tokens": 7,
            "max_tokens": 9,
            "logprobs": True,
            "top_logprobs": 3,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u",
            "tool_choice": "none",
            "response_format": {"type": "text"},
        }
    )
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant"]
    assert req.messages[1]["content"] == "a\nb"
    assert (req.max_tokens, req.max_tokens_default, req.logprobs, req.n, req.include_usage_in_stream) == (
        7,
        False,
        3,
        2,
        True,
    )
    assert parse({"messages": USER, "logprobs": True}).logprobs == 0
    assert parse({"messages": USER}).logprobs is None
    assert parse({"messages": USER}).max_tokens_default is True  # as much as the context leaves


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": USER, "logprobs": 1}, "logprobs"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": USER, "store": True}, "store"),
        ({"messages": USER, "echo": True}, "echo"),
        ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": USER, "model": "other"}, "model"),
    ],
)
def test_bad_chat_requests_are_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(body)
    assert info.value.param == param
    assert info.value.status in (400, 404)


def test_the_template_makes_the_prompt_and_a_file_overrides_it(shipped_pair: tuple[Path, Path], tmp_path: Path) -> None:
    tokenizer = load_tokenizer(shipped_pair[1])
    req = parse({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
    ids = render_chat(tokenizer, req, None)
    assert tokenizer.decode(ids) == "<|bos|># system: s\n# user: u\n# assistant:\n"
    assert ids.count(tokenizer.bos_token_id) == 1
    path = tmp_path / "template.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}")
    assert tokenizer.decode(render_chat(tokenizer, req, load_chat_template(path))) == "[system] s[user] u"
    with pytest.raises(ValueError, match="cannot read the chat template"):
        load_chat_template(tmp_path / "missing.jinja")


def test_a_model_without_a_template_gets_a_clear_400(shipped_pair: tuple[Path, Path]) -> None:
    tokenizer = load_tokenizer(shipped_pair[1])
    tokenizer.chat_template = None
    with pytest.raises(RequestError) as info:
        render_chat(tokenizer, parse({"messages": USER}), None)
    assert info.value.code == "chat_template_missing" and "--chat-template" in info.value.message
    broken = "{{ raise_exception('no system messages') }}"
    with pytest.raises(RequestError) as info:
        render_chat(tokenizer, parse({"messages": USER}), broken)
    assert info.value.param == "messages" and "no system messages" in info.value.message
