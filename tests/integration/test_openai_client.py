"""The official ``openai`` client against a real star: chat and completions, plain and streamed, and the
fields OpenAI and vLLM users send (n, batched prompts, echo, logprobs, vLLM's extras), each checked against the
target alone."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from starsd.local import LocalStar, http_json
from starsd.verifier.processing import LogitRules, apply_rules
from tests.integration.conftest import Reference

PROMPT = "class Parser:\n    def parse(self, text):\n"
MESSAGES = [{"role": "system", "content": "write python"}, {"role": "user", "content": "parse a file"}]


@pytest.fixture(scope="module")
def client(star1: LocalStar) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{star1.urls[0]}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def chat_prompt(reference: Reference, messages: list[dict[str, str]] = MESSAGES) -> list[int]:
    tokenizer = reference.model.tokenizer
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def decode(reference: Reference, ids: list[int]) -> str:
    text: str = reference.model.tokenizer.decode(ids, skip_special_tokens=True)
    return text


def greedy_with(reference: Reference, prompt: list[int], max_tokens: int, rules: LogitRules) -> list[int]:
    """The target alone, one full forward pass per token, with ``rules`` applied to its last logits."""
    loaded = reference.model
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = loaded.model(torch.tensor([prompt + out], device=loaded.device)).logits[
                0, -1:, : loaded.vocab_size
            ]
            token = int(apply_rules(logits, rules, prompt, out, []).argmax())
            if token in rules.end_ids:
                break
            out.append(token)
    return out


def test_chat_completion_is_the_target_alone_on_the_templated_prompt(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=20, temperature=0)  # type: ignore[arg-type]
    assert out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    message = out.choices[0].message
    assert message.role == "assistant"
    expected = reference.greedy(chat_prompt(reference), 20)
    assert message.content == decode(reference, expected)
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(chat_prompt(reference)), len(expected))
    assert out.choices[0].finish_reason == ("length" if len(expected) == 20 else "stop")


def test_chat_accepts_text_parts_and_max_completion_tokens(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "parse"}, {"type": "text", "text": "a file"}]}]
    out = client.chat.completions.create(model=model, messages=parts, max_completion_tokens=6, temperature=0)  # type: ignore[arg-type]
    joined = chat_prompt(reference, [{"role": "user", "content": "parse\na file"}])
    assert out.choices[0].message.content == decode(reference, reference.greedy(joined, 6))


def test_streamed_chat_sends_the_role_first_and_usage_only_when_asked(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    expected = decode(reference, reference.greedy(chat_prompt(reference), 20))
    for include_usage in (True, False):
        options = {"include_usage": True} if include_usage else None
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=20,
                temperature=0,
                stream=True,
                stream_options=options,  # type: ignore[arg-type]
            )
        )
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        with_choices = [c for c in chunks if c.choices]
        assert "".join(c.choices[0].delta.content or "" for c in with_choices) == expected
        assert with_choices[-1].choices[0].finish_reason in ("stop", "length")
        assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
        if include_usage:
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens > 0
            assert all(c.usage is None for c in chunks[:-1])
        else:
            assert all(c.usage is None for c in chunks)


def test_streamed_completion_usage_is_a_final_chunk_without_choices(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True))
    assert all(c.usage is None for c in plain)
    assert "".join(c.choices[0].text for c in plain) == "".join(c.choices[0].text for c in chunks[:-1])


def test_stream_options_without_stream_is_refused(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, stream_options={"include_usage": True})
    assert info.value.body["param"] == "stream_options"  # type: ignore[index]


def test_a_model_is_retrieved_by_its_id(client: openai.OpenAI, model: str) -> None:
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_batched_prompts_and_n_give_one_choice_each_in_order(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    prompts = [PROMPT, "import os\nimport sys\n"]
    out = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=10, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for c in out.choices:
        assert c.text == decode(reference, reference.greedy(prompts[c.index // 2], 10))
    assert out.usage is not None
    assert out.usage.prompt_tokens == sum(len(reference.encode(p)) for p in prompts)
    token_prompts = [reference.encode(p) for p in prompts]
    out = client.completions.create(model=model, prompt=token_prompts, max_tokens=10, temperature=0)
    assert [c.text for c in out.choices] == [decode(reference, reference.greedy(p, 10)) for p in token_prompts]


def test_sampled_choices_are_independent_and_the_first_is_the_seeded_single_one(
    client: openai.OpenAI, model: str
) -> None:
    out = client.completions.create(model=model, prompt=PROMPT, n=4, max_tokens=16, temperature=1.0, seed=7)
    texts = [c.text for c in out.choices]
    assert len(set(texts)) > 1  # four samples of 16 tokens from a sampled model do not all agree
    single = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=7)
    assert single.choices[0].text == texts[0]
    again = client.completions.create(model=model, prompt=PROMPT, n=4, max_tokens=16, temperature=1.0, seed=7)
    assert [c.text for c in again.choices] == texts


def test_streamed_n_choices_each_reassemble_to_the_whole(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    prompts = [PROMPT, "for i in range("]
    chunks = list(client.completions.create(model=model, prompt=prompts, max_tokens=12, temperature=0, stream=True))
    for index, prompt in enumerate(prompts):
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].index == index)
        assert text == decode(reference, reference.greedy(prompt, 12))


def test_echo_puts_the_prompt_before_the_completion(client: openai.OpenAI, model: str, reference: Reference) -> None:
    out = client.completions.create(model=model, prompt=PROMPT, echo=True, max_tokens=8, temperature=0)
    assert out.choices[0].text == PROMPT + decode(reference, reference.greedy(PROMPT, 8))
    chunks = list(
        client.completions.create(model=model, prompt=PROMPT, echo=True, max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text


def test_stop_token_ids_end_the_completion_before_that_token(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    full = reference.greedy(PROMPT, 24)
    stop_id = full[6]
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"stop_token_ids": [stop_id]}
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.model_extra is not None
    assert out.model_extra["starsd"]["token_ids"] == full[: full.index(stop_id)]


def test_logit_bias_ignore_eos_and_min_tokens_change_the_output_exactly(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    eos = reference.model.eos_token_id
    assert eos is not None
    bias = {str(eos): 100}
    ended = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0, logit_bias=bias)  # type: ignore[arg-type]
    assert ended.usage is not None and ended.usage.completion_tokens == 0
    assert ended.choices[0].finish_reason == "stop" and ended.choices[0].text == ""
    ignored = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=10,
        temperature=0,
        logit_bias=bias,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )
    assert ignored.usage is not None and ignored.usage.completion_tokens == 10
    assert ignored.choices[0].finish_reason == "length"
    held = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=10,
        temperature=0,
        logit_bias=bias,
        extra_body={"min_tokens": 5},  # type: ignore[arg-type]
    )
    assert held.usage is not None and held.usage.completion_tokens == 5
    rules = LogitRules(min_tokens=5, end_ids=(eos,), logit_bias={eos: 100.0})
    assert held.model_extra is not None
    assert held.model_extra["starsd"]["token_ids"] == greedy_with(reference, reference.encode(PROMPT), 10, rules)


def test_top_k_1_samples_the_argmax(client: openai.OpenAI, model: str, reference: Reference) -> None:
    for seed in (1, 2):
        out = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed, extra_body={"top_k": 1}
        )
        assert out.choices[0].text == decode(reference, reference.greedy(PROMPT, 16))


def test_penalties_give_the_target_alones_penalised_output(
    client: openai.OpenAI, model: str, reference: Reference
) -> None:
    eos = reference.model.eos_token_id
    fields = {"presence_penalty": 1.5, "frequency_penalty": 0.5}
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={**fields, "repetition_penalty": 1.3}
    )
    rules = LogitRules(end_ids=(eos,) if eos is not None else (), repetition_penalty=1.3, **fields)
    expected = greedy_with(reference, reference.encode(PROMPT), 24, rules)
    assert out.model_extra is not None
    assert out.model_extra["starsd"]["token_ids"] == expected
    assert expected != reference.greedy(PROMPT, 24)  # the penalties did change the output


def reference_logprobs(reference: Reference, prompt: list[int], generated: list[int]) -> torch.Tensor:
    loaded = reference.model
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([prompt + generated], device=loaded.device)).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1 : -1, : loaded.vocab_size].float(), dim=-1)


def test_completion_logprobs_are_the_targets(client: openai.OpenAI, model: str, reference: Reference) -> None:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    generated = reference.greedy(PROMPT, 12)
    expected = reference_logprobs(reference, reference.encode(PROMPT), generated)
    for j, token in enumerate(generated):
        assert lp.token_logprobs[j] == pytest.approx(float(expected[j, token]), abs=1e-4)
        assert len(lp.top_logprobs[j]) == 3
        assert max(lp.top_logprobs[j].values()) == pytest.approx(lp.token_logprobs[j], abs=1e-6)  # greedy: the top
    assert lp.tokens is not None and "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset is not None and lp.text_offset[0] == 0
    streamed = list(
        client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3, stream=True)
    )
    tokens = [lp for c in streamed for lp in (c.choices[0].logprobs.token_logprobs or [])]  # type: ignore[union-attr]
    assert tokens == pytest.approx(lp.token_logprobs, abs=1e-6)


def test_chat_logprobs_have_openais_shape(client: openai.OpenAI, model: str, reference: Reference) -> None:
    out = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,  # type: ignore[arg-type]
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    generated = reference.greedy(chat_prompt(reference), 8)
    expected = reference_logprobs(reference, chat_prompt(reference), generated)
    assert [entry.logprob for entry in content] == pytest.approx(
        [float(expected[j, t]) for j, t in enumerate(generated)], abs=1e-4
    )
    assert all(len(entry.top_logprobs) == 2 for entry in content)
    assert "".join(entry.token for entry in content) == out.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": "x"}, "suffix"),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True, "logprobs": 1}, "echo"),
    ],
)
def test_fields_that_would_change_the_output_are_refused_by_name(
    client: openai.OpenAI, model: str, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert info.value.body["param"] == param  # type: ignore[index]


def test_chat_refuses_tools_and_images_by_name(client: openai.OpenAI, model: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=MESSAGES, tools=[tool])  # type: ignore[arg-type, list-item]
    assert info.value.body["param"] == "tools"  # type: ignore[index]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=image)  # type: ignore[arg-type]
    assert info.value.body["param"] == "messages"  # type: ignore[index]


def test_vllms_paths_answer(star1: LocalStar, model: str, reference: Reference) -> None:
    base = star1.urls[0]
    assert http_json(f"{base}/health")[0] == 200
    status, version = http_json(f"{base}/version")
    assert status == 200 and version["version"]
    status, tokens = http_json(f"{base}/tokenize", {"model": model, "prompt": PROMPT})
    assert status == 200 and tokens["tokens"] == reference.encode(PROMPT) and tokens["count"] == len(tokens["tokens"])
    status, chat = http_json(f"{base}/tokenize", {"messages": MESSAGES})
    assert status == 200 and chat["tokens"] == chat_prompt(reference)
    status, text = http_json(f"{base}/detokenize", {"tokens": reference.encode(PROMPT)})
    assert status == 200 and text["prompt"] == reference.model.tokenizer.decode(reference.encode(PROMPT))
    status, err = http_json(f"{base}/detokenize", {"tokens": [10**6]})
    assert status == 400 and err["error"]["param"] == "tokens"


def test_metrics_carry_vllms_names_with_the_model_name(client: openai.OpenAI, star1: LocalStar, model: str) -> None:
    client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    with urllib.request.urlopen(f"{star1.urls[0]}/metrics", timeout=10) as resp:
        families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_success",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
    ):
        samples = families[name].samples
        assert samples and all(s.labels.get("model_name") == model for s in samples), name
    success = families["vllm:request_success"].samples
    assert any(s.labels["finished_reason"] == "length" and s.value >= 1 for s in success)
    per_pos = [s for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples if s.name.endswith("_total")]
    accepted = sum(
        s.value for s in families["vllm:spec_decode_num_accepted_tokens"].samples if s.name.endswith("_total")
    )
    assert sum(s.value for s in per_pos) == accepted > 0
    by_position = {int(s.labels["position"]): s.value for s in per_pos}
    assert all(by_position[p] >= by_position.get(p + 1, 0) for p in by_position)  # a later position needs the earlier


def test_a_raw_stream_ends_with_done(star1: LocalStar, model: str) -> None:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    req = urllib.request.Request(
        f"{star1.urls[0]}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
