"""The draft's lean decoding pass computes what the model's own forward pass computes, through the same slot pool.

Compared on the tiny pair and its grouped-query twin, one row and a batch of rows at different lengths, one fed
token and several, each against the model's own pass over the same cache (float32: equal to rounding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from starsd import kvcache
from starsd.checkpoints import load_checkpoint
from starsd.draft.runner import DraftRunner
from starsd.lean_decode import LeanDecoder, unsupported_reason
from starsd.proposals import DraftRequest
from starsd.sampling import SamplingParams
from starsd.verifier.memory import kv_geometry

GREEDY = SamplingParams(temperature=0.0)


def pool_for(model: Any) -> kvcache.SlotPool:
    layers, heads, head_dim = kv_geometry(model.config)
    pool = kvcache.SlotPool(layers, heads, head_dim, torch.float32, torch.device("cpu"))
    kvcache.use_pool_attention(model)
    return pool


def both_passes(
    checkpoint: Path, prefixes: list[list[int]], feeds: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill one slot per row with ``prefixes`` (the model's own pass), then compute the next pass over ``feeds``
    twice from the same cache: with the model's pass, as loaded, and with the lean one (on a second copy, whose
    weights it folds). Returns both ``[B, V]`` logits."""
    out = []
    for use_lean in (False, True):
        model = load_checkpoint(checkpoint).model
        lean = LeanDecoder(model, 256) if use_lean else None
        pool = pool_for(model)
        slots = [pool.take() for _ in prefixes]
        pool.reserve(max(len(p) + len(f) for p, f in zip(prefixes, feeds, strict=True)) + 1)
        rows = pool.rows_of(slots)
        with torch.inference_mode():
            for slot, row, prefix in zip(slots, rows, prefixes, strict=True):
                inputs = kvcache.step_inputs([prefix], [row], [0], [len(prefix)], torch.device("cpu"))
                cache = pool.step_cache([slot], [0], [len(prefix)], inputs)
                model(input_ids=inputs.input_ids, use_cache=True, **kvcache.with_cache(cache))
            cached, widths = [len(p) for p in prefixes], [len(f) for f in feeds]
            inputs = kvcache.step_inputs(feeds, rows, cached, widths, torch.device("cpu"))
            cache = pool.step_cache(slots, cached, widths, inputs)
            if lean is not None:
                # One row has no positions tensor: its first fed token's position, as the draft's runner passes it.
                positions = cached[0] if inputs.positions is None else inputs.positions
                assert inputs.input_ids is not None
                out.append(lean.logits(inputs.input_ids, positions, cache, inputs.mask))
            else:
                logits = model(
                    input_ids=inputs.input_ids, use_cache=True, **kvcache.with_cache(cache), **inputs.model_kwargs()
                ).logits[:, -1]
                out.append(logits)
    return out[0], out[1]


CASES = {
    "one row, one token": ([[5, 17, 42, 7]], [[99]]),
    "one row, three tokens": ([[5, 17, 42, 7]], [[99, 3, 250]]),
    "a batch, one token each": ([[5, 17, 42, 7], [9, 8], [300, 301, 302, 303, 304, 305]], [[99], [4], [12]]),
    "a batch, ragged feeds": ([[5, 17, 42, 7], [9, 8], [300, 301, 302]], [[99, 1], [4], [12, 13, 14]]),
}


@pytest.mark.parametrize("case", CASES)
def test_the_lean_pass_equals_the_models_own(case: str, any_pair: tuple[Path, Path]) -> None:
    prefixes, feeds = CASES[case]
    own, lean = both_passes(any_pair[0], prefixes, feeds)
    torch.testing.assert_close(lean, own, rtol=1e-4, atol=1e-4)
    assert torch.equal(lean.argmax(-1), own.argmax(-1))


def test_a_runner_proposes_the_same_tokens_with_the_lean_pass(shipped_pair: tuple[Path, Path]) -> None:
    draft = load_checkpoint(shipped_pair[0])
    prompts = [[5, 17, 42, 7, 99, 3], [9, 8, 7], [300, 301, 302, 303]]
    answers = []
    for lean in (False, True):
        runner = DraftRunner(draft, ahead="off", lean=lean)
        states = [runner.new_state(None) for _ in prompts]
        first = runner.propose_batch([DraftRequest(s, p, 4, GREEDY, 8) for s, p in zip(states, prompts, strict=True)])
        news = [[*f.token_ids[:2], 11] for f in first]
        second = runner.propose_batch([DraftRequest(s, n, 4, GREEDY, 8) for s, n in zip(states, news, strict=True)])
        answers.append([p.token_ids for p in first + second])
    assert answers[0] == answers[1]


def test_models_it_does_not_know_keep_their_own_pass(random_pair: tuple[Path, Path]) -> None:
    loaded = load_checkpoint(random_pair[0])
    assert unsupported_reason(loaded.model) is None
    loaded.model.config.attention_bias = True
    try:
        assert unsupported_reason(loaded.model) == "biases in attention or MLP"
        with pytest.raises(ValueError, match="no lean decoding pass for this model: biases"):
            LeanDecoder(loaded.model, 64)
        assert DraftRunner(loaded).lean_decoder is None
    finally:
        loaded.model.config.attention_bias = False


def test_the_folded_weights_are_the_models_own_not_a_copy(random_pair: tuple[Path, Path]) -> None:
    model = load_checkpoint(random_pair[0]).model
    lean = LeanDecoder(model, 64)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    layer = lean.layers[0]
    for linear, matrix in [
        (attn.q_proj, layer.qkv),
        (attn.k_proj, layer.qkv),
        (attn.v_proj, layer.qkv),
        (attn.o_proj, layer.out),
        (mlp.gate_proj, layer.gate_up),
        (mlp.up_proj, layer.gate_up),
        (mlp.down_proj, layer.down),
    ]:
        assert linear.weight.untyped_storage().data_ptr() == matrix.untyped_storage().data_ptr()
    with torch.no_grad():
        layer.qkv[0, 0] += 1.0  # one memory: the model's own query projection sees it
    assert attn.q_proj.weight[0, 0] == layer.qkv[0, 0]


def test_folding_leaves_the_models_own_pass_as_it_was(any_pair: tuple[Path, Path]) -> None:
    tokens = torch.tensor([[5, 17, 42, 7, 99, 3, 250, 1]])
    with torch.inference_mode():
        before = load_checkpoint(any_pair[0]).model(input_ids=tokens).logits
        model = load_checkpoint(any_pair[0]).model
        LeanDecoder(model, 64)
        after = model(input_ids=tokens).logits
        LeanDecoder(model, 64)  # a second decoder on the same model: folding again changes nothing
        again = model(input_ids=tokens).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(again, before, rtol=1e-4, atol=1e-4)
