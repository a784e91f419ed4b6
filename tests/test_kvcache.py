"""The preallocated key/value cache gives the model exactly what transformers' own dynamic cache gives."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache

from starsd import kvcache
from starsd.runners import load_checkpoint


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
