"""The preallocated key/value cache gives the model exactly what transformers' own dynamic cache gives."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from starsd import kvcache
from starsd.checkpoints import load_checkpoint


def test_grown_shape_doubles_within_the_limit_and_never_below_need() -> None:
    assert kvcache.grown_shape((0, 0), (1, 40), None) == (1, 40)
    assert kvcache.grown_shape((4, 64), (5, 64), None) == (8, 64)  # slots double
    assert kvcache.grown_shape((4, 64), (3, 100), None) == (4, 128)  # capacity doubles, slots stay
    assert kvcache.grown_shape((4, 64), (5, 64), 5 * 64) == (5, 64)  # the doubling's slack is given up first
    assert kvcache.grown_shape((8, 64), (2, 300), 1000) == (3, 300)  # unneeded slots are given up too
    for have in [(0, 0), (3, 17), (16, 512)]:
        for need in [(1, 1), (2, 300), (16, 60), (40, 25)]:
            s, c = kvcache.grown_shape(have, need, 1000)
            assert s >= need[0] and c >= need[1] and s * c <= 1000, (have, need, s, c)


def _write(pool: kvcache.SlotPool, slot: kvcache.PoolSlot, cached: int, value: float) -> torch.Tensor:
    """Append one token whose key is ``value`` to ``slot``; returns the slot's keys after it ``[cached + 1]``."""
    pool.reserve(cached + 2)
    cache = pool.step_cache([slot], [cached], [1])
    key = torch.full((1, 1, 1, 1), value)
    keys, _ = cache.layers[0].update(key, key)
    return keys[0, 0, :, 0]


def test_the_slot_pool_keeps_live_rows_through_reallocation_and_frees_dropped_slots() -> None:
    pool = kvcache.SlotPool(1, 1, 1, torch.float32, torch.device("cpu"), limit=None)
    slots = [pool.take() for _ in range(3)]
    for step in range(3):
        for i, slot in enumerate(slots):
            _write(pool, slot, step, 10 * i + step)
    slots[1].release()
    assert pool.used == 2
    pool.reserve(200)  # a reallocation: the live rows move with their data
    assert pool.capacity >= 200
    assert _write(pool, slots[0], 3, 3).tolist() == [0, 1, 2, 3]
    assert _write(pool, slots[2], 3, 23).tolist() == [20, 21, 22, 23]
    dropped = pool.take()
    del dropped  # a slot nobody released is freed when its handle is collected
    gc.collect()
    assert pool.used == 2


def test_a_bounded_pool_compacts_its_rows_to_stay_within_its_limit() -> None:
    pool = kvcache.SlotPool(1, 1, 1, torch.float32, torch.device("cpu"), limit=40)
    slots = [pool.take() for _ in range(4)]  # four slots of short sessions
    for i, slot in enumerate(slots):
        _write(pool, slot, 0, i)
    for slot in slots[:3]:
        slot.release()
    pool.reserve(30)  # one long session left: the pool gives up its free rows to fit 30 tokens a slot
    assert pool.slots * pool.capacity <= 40 and pool.capacity >= 30
    assert _write(pool, slots[3], 1, 9).tolist() == [3, 9]
    with pytest.raises(MemoryError, match="over its limit of 40 tokens"):
        pool.reserve(41)


def test_grouped_attention_equals_attention_over_repeated_keys() -> None:
    """The runners' attention reads grouped-query keys as the pool stores them; it computes what transformers'
    SDPA path computes after ``repeat_kv`` (with a padding mask, and causal without one)."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    gen = torch.Generator().manual_seed(3)
    query = torch.randn(3, 8, 5, 16, generator=gen)
    key, value = torch.randn(3, 2, 12, 16, generator=gen), torch.randn(3, 2, 12, 16, generator=gen)
    mask = torch.rand(3, 1, 5, 12, generator=gen) < 0.7
    mask[..., 0] = True
    module = SimpleNamespace(num_key_value_groups=4, is_causal=True)
    repeated = SimpleNamespace(num_key_value_groups=1, is_causal=True)  # keys and values repeated already
    ours, _ = kvcache.grouped_sdpa_attention(module, query, key, value, mask)  # type: ignore[arg-type]
    theirs, _ = sdpa_attention_forward(repeated, query, repeat_kv(key, 4), repeat_kv(value, 4), mask)  # type: ignore[arg-type]
    torch.testing.assert_close(ours, theirs)
    square = key[:, :, :5], value[:, :, :5]
    ours, _ = kvcache.grouped_sdpa_attention(module, query, *square, None)  # type: ignore[arg-type]
    theirs, _ = sdpa_attention_forward(repeated, query, *(repeat_kv(t, 4) for t in square), None)  # type: ignore[arg-type]
    torch.testing.assert_close(ours, theirs)


def test_the_gqa_pair_groups_query_heads_and_the_runners_read_them_ungrouped(gqa_pair: tuple[Path, Path]) -> None:
    from starsd.draft.runner import DraftRunner
    from starsd.proposals import SamplingParams
    from starsd.verifier.runner import TargetRunner

    for path in gqa_pair:
        loaded = load_checkpoint(path)
        config = loaded.model.config
        assert config.num_key_value_heads < config.num_attention_heads
        runner = TargetRunner(loaded)
        assert config._attn_implementation == kvcache.POOL_ATTENTION
        assert runner.pool.kv_heads == config.num_key_value_heads  # the pool stores the key/value heads only
    draft = DraftRunner(load_checkpoint(gqa_pair[0]))
    draft.propose(draft.new_state(0), [1, 2, 3], 2, SamplingParams(0.0), 4)
    assert draft.loaded.model.config._attn_implementation == kvcache.POOL_ATTENTION
