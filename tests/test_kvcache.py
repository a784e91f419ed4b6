"""The preallocated key/value cache gives the model exactly what transformers' own dynamic cache gives."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from starsd import kvcache
from starsd.checkpoints import load_checkpoint


def test_slab_cache_matches_the_dynamic_cache_through_growth_and_crops(random_pair: tuple[Path, Path]) -> None:
    model = load_checkpoint(random_pair[0]).model
    slab, dynamic = kvcache.new_cache(), DynamicCache()
    gen = torch.Generator().manual_seed(0)
    length = 0
    with torch.inference_mode():
        # Feeds of various widths take the slab past its first capacity twice; crops roll it back.
        for width, crop in [(40, None), (30, 60), (1, None), (50, 100), (70, 20), (1, None), (90, None)]:
            ids = torch.randint(0, model.config.vocab_size, (1, width), generator=gen)
            a = model(input_ids=ids, use_cache=True, **kvcache.with_cache(slab)).logits
            b = model(input_ids=ids, use_cache=True, **kvcache.with_cache(dynamic)).logits
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            length += width
            assert slab.get_seq_length() == dynamic.get_seq_length() == length
            if crop is not None:
                slab.crop(crop)  # the slab crops to an absolute length (what the runners use)
                dynamic.crop(crop - length)  # a negative count: the one form transformers 4.x and 5.x share
                length = crop
                assert slab.get_seq_length() == crop


def test_a_batch_cache_right_aligns_each_session_and_copies_rows_back() -> None:
    caches = [kvcache.new_cache() for _ in range(3)]
    lengths = [3, 0, 5]
    for cache, n in zip(caches, lengths, strict=True):
        if n:
            cache.update(torch.arange(n, dtype=torch.float32).view(1, 1, n, 1) + 1, torch.full((1, 1, n, 1), 7.0), 0)
    batch = kvcache.batch_cache(caches, lengths, layers=1, capacity=8)
    assert batch.get_seq_length() == 5
    keys = kvcache.layer(batch, 0).keys
    assert keys is not None
    assert keys[:, 0, :, 0].tolist() == [[0, 0, 1, 2, 3], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]]
    batch.update(torch.full((3, 1, 2, 1), 9.0), torch.zeros(3, 1, 2, 1), 0)
    kvcache.copy_row(batch, 0, [(2, 5), (6, 7)], caches[1], layers=1)
    copied = kvcache.layer(caches[1], 0).keys
    assert copied is not None
    assert copied[0, 0, :, 0].tolist() == [1, 2, 3, 9]


def test_the_slab_crops_to_an_absolute_length_and_resets() -> None:
    # The runners crop to the number of tokens to keep, 0 included (transformers 5.x's own layers take a
    # negative count instead and treat 0 as "remove nothing").
    cache = kvcache.new_cache()
    cache.update(torch.ones(1, 1, 6, 1), torch.ones(1, 1, 6, 1), 0)
    cache.crop(4)
    assert cache.get_seq_length() == 4
    cache.crop(-1)
    assert cache.get_seq_length() == 3
    cache.crop(5)  # longer than the cache: nothing to do
    assert cache.get_seq_length() == 3
    cache.crop(0)
    assert cache.get_seq_length() == 0
    cache.update(torch.full((1, 1, 2, 1), 3.0), torch.zeros(1, 1, 2, 1), 0)
    keys = kvcache.layer(cache, 0).keys
    assert keys is not None and keys[0, 0, :, 0].tolist() == [3.0, 3.0]
    cache.reset()
    assert cache.get_seq_length() == 0


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
