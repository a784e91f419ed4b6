"""The completions request contract: what is accepted, and the clear 4xx for what is not."""

from __future__ import annotations

from typing import Any

import pytest

from starsd.openai_api.detokenize import stream_safe_length
from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import Limits, check_context, parse_completion
from tests.support.stops import find_stop

LIMITS = Limits(vocab_size=100, max_context=64, max_tokens_cap=50)
MODELS = ("target",)


def parse(body: Any):
    return parse_completion(body, LIMITS, MODELS)


def test_defaults_follow_openai() -> None:
    req = parse({"prompt": "hi"})
    assert (req.max_tokens, req.temperature, req.top_p, req.stream, req.stop, req.seed) == (
        16,
        1.0,
        1.0,
        False,
        [],
        None,
    )


def test_token_list_and_batched_prompts_are_accepted() -> None:
    assert parse({"prompt": [1, 2, 3]}).prompts == ([1, 2, 3],)
    assert parse({"prompt": ["hello"]}).prompt == "hello"
    assert parse({"prompt": [[4, 5]]}).prompt == [4, 5]
    assert parse({"prompt": ["a", "b"]}).prompts == ("a", "b")
    assert parse({"prompt": [[4, 5], [6]], "n": 3}).prompts == ([4, 5], [6])


def test_vllm_extras_and_openai_sampling_fields_are_read() -> None:
    req = parse(
        {
            "prompt": "x",
            "max_tokens": 8,
            "n": 2,
            "best_of": 2,
            "logprobs": 3,
            "top_k": -1,
            "min_tokens": 4,
            "ignore_eos": True,
            "stop_token_ids": [7, 9],
            "presence_penalty": 0.5,
            "frequency_penalty": -0.25,
            "repetition_penalty": 1.2,
            "logit_bias": {"5": -100, "6": 2.5},
        }
    )
    assert (req.n, req.logprobs, req.top_k, req.min_tokens, req.ignore_eos) == (2, 3, 0, 4, True)
    assert req.stop_token_ids == (7, 9)
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty) == (0.5, -0.25, 1.2)
    assert req.logit_bias == {5: -100.0, 6: 2.5}
    assert parse({"prompt": "x", "echo": True}).echo is True


def test_stop_string_becomes_a_list() -> None:
    assert parse({"prompt": "x", "stop": "\n"}).stop == ["\n"]


@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ([1, 2], None, 400),
        ({}, "prompt", 400),
        ({"prompt": ""}, "prompt", 400),
        ({"prompt": 5}, "prompt", 400),
        ({"prompt": [1, "a"]}, "prompt", 400),
        ({"prompt": [1, 100]}, "prompt", 400),
        ({"prompt": [-1]}, "prompt", 400),
        ({"prompt": ["a", [1]]}, "prompt", 400),
        ({"prompt": ["a", 1]}, "prompt", 400),
        ({"prompt": [[1], [100]]}, "prompt", 400),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": 10**9}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": "ten"}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": 2.5}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": True}, "max_tokens", 400),
        ({"prompt": "x", "temperature": "hot"}, "temperature", 400),
        ({"prompt": "x", "temperature": -0.1}, "temperature", 400),
        ({"prompt": "x", "top_p": 0}, "top_p", 400),
        ({"prompt": "x", "top_p": 1.5}, "top_p", 400),
        ({"prompt": "x", "seed": "s"}, "seed", 400),
        ({"prompt": "x", "seed": -3}, "seed", 400),
        ({"prompt": "x", "stream": "yes"}, "stream", 400),
        ({"prompt": "x", "stop": 3}, "stop", 400),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", 400),
        ({"prompt": "x", "stop": [""]}, "stop", 400),
        ({"prompt": "x", "n": 0}, "n", 400),
        ({"prompt": "x", "n": 65}, "n", 400),
        ({"prompt": ["x"] * 40, "n": 2}, "n", 400),
        ({"prompt": "x", "best_of": 3}, "best_of", 400),
        ({"prompt": "x", "logprobs": 21}, "logprobs", 400),
        ({"prompt": "x", "logprobs": True}, "logprobs", 400),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo", 400),
        ({"prompt": "x", "suffix": "y"}, "suffix", 400),
        ({"prompt": "x", "tools": []}, "tools", 400),
        ({"prompt": "x", "guided_json": {}}, "guided_json", 400),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", 400),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, "stream_options", 400),
        ({"prompt": "x", "stream": True, "stream_options": {"other": 1}}, "stream_options", 400),
        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias", 400),
        ({"prompt": "x", "logit_bias": {"100": 1}}, "logit_bias", 400),
        ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias", 400),
        ({"prompt": "x", "logit_bias": [1]}, "logit_bias", 400),
        ({"prompt": "x", "stop_token_ids": [100]}, "stop_token_ids", 400),
        ({"prompt": "x", "stop_token_ids": 3}, "stop_token_ids", 400),
        ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens", 400),
        ({"prompt": "x", "top_k": -2}, "top_k", 400),
        ({"prompt": "x", "top_k": 1.5}, "top_k", 400),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty", 400),
        ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty", 400),
        ({"prompt": "x", "frequency_penalty": "a"}, "frequency_penalty", 400),
        ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos", 400),
        ({"prompt": "x", "model": 7}, "model", 400),
        ({"prompt": "x", "model": "gpt-4"}, "model", 404),
    ],
)
def test_bad_requests_are_refused_naming_the_field(body: Any, param: str | None, status: int) -> None:
    with pytest.raises(RequestError) as info:
        parse(body)
    assert info.value.status == status
    assert info.value.param == param
    assert info.value.body()["error"]["message"]


def test_fields_that_do_not_change_the_output_are_accepted() -> None:
    assert parse({"prompt": "x", "user": "u1", "metadata": {"k": "v"}}).include_usage_in_stream is False
    options = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    assert parse(options).include_usage_in_stream is True


def test_context_length_counts_prompt_and_completion() -> None:
    check_context(60, 4, LIMITS)
    with pytest.raises(RequestError) as info:
        check_context(60, 5, LIMITS)
    assert info.value.code == "context_length_exceeded"
    assert "64" in info.value.message


def test_stop_sequences_are_found_and_held_back_while_streaming() -> None:
    assert find_stop("abc\ndef", ["\n"]) == 3
    assert find_stop("abcdef", ["x", "cd", "b"]) == 1
    assert find_stop("abc", ["z"]) is None
    assert stream_safe_length("hello wor", ["world"]) == len("hello ")
    assert stream_safe_length("hello", ["world"]) == 5
