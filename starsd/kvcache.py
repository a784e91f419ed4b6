"""A key/value cache that writes into preallocated memory instead of concatenating on every step.

transformers' ``DynamicLayer`` appends by ``torch.cat``, copying the whole cache on every forward pass. For
a small draft model that copy (and the allocation) costs more than the model's own arithmetic. A
:class:`SlabLayer` keeps keys and values in a buffer ``[B, H, capacity, D]`` with room to grow (doubling),
so appending is one slice assignment, cropping is setting a length, and a batch of sessions can be laid out
in one buffer and copied back row by row.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

MIN_CAPACITY = 64


class SlabLayer(DynamicLayer):
    """One layer's keys and values: ``buffer[..., :length, :]`` is the cache, the rest is room to grow."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, length: int = 0) -> None:
        super().__init__()
        self._k: torch.Tensor | None = keys
        self._v: torch.Tensor | None = values
        self.length = 0
        if keys is not None and values is not None:
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self._set_length(length)

    def _set_length(self, length: int) -> None:
        assert self._k is not None and self._v is not None
        self.length = length
        self.keys = self._k[..., :length, :]
        self.values = self._v[..., :length, :]

    def _reserve(self, needed: int, like: torch.Tensor) -> None:
        capacity = 0 if self._k is None else self._k.shape[-2]
        if needed <= capacity:
            return
        shape = list(like.shape)
        shape[-2] = max(MIN_CAPACITY, needed, 2 * capacity)
        k = torch.empty(shape, dtype=like.dtype, device=like.device)
        v = torch.empty(shape, dtype=like.dtype, device=like.device)
        if self._k is not None and self._v is not None and self.length:
            k[..., : self.length, :] = self._k[..., : self.length, :]
            v[..., : self.length, :] = self._v[..., : self.length, :]
        self._k, self._v = k, v

    def lazy_initialization(self, key_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict[str, Any] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states)
        start, end = self.length, self.length + key_states.shape[-2]
        self._reserve(end, key_states)
        assert self._k is not None and self._v is not None
        self._k[..., start:end, :] = key_states
        self._v[..., start:end, :] = value_states
        self._set_length(end)
        return self._k[..., :end, :], self._v[..., :end, :]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.length + max_length
        if self._k is not None and max_length < self.length:
            self._set_length(max(0, max_length))

    def batch_repeat_interleave(self, repeats: int) -> None:  # pragma: no cover - beam search is not used
        raise NotImplementedError("SlabLayer does not support beam search")

    def batch_select_indices(self, indices: torch.Tensor) -> None:  # pragma: no cover - beam search is not used
        raise NotImplementedError("SlabLayer does not support beam search")


def new_cache() -> Cache:
    """An empty per-session cache whose layers are created on the first forward pass."""
    return Cache(layer_class_to_replicate=SlabLayer)


def layer(cache: Cache, index: int) -> SlabLayer:
    slab = cache.layers[index]
    assert isinstance(slab, SlabLayer)
    return slab


def batch_cache(caches: list[Cache], lengths: list[int], layers: int, capacity: int) -> Cache:
    """One cache ``[B, H, capacity, D]`` holding each session's ``lengths[b]`` cached tokens right-aligned.

    Row ``b`` occupies columns ``[past - lengths[b], past)`` with ``past = max(lengths)``; the columns to
    its left are zeros (finite, so that masked attention weights of zero stay zero). The returned cache
    starts at length ``past``.
    """
    past = max(lengths)
    source = next((c for c, n in zip(caches, lengths, strict=True) if n), None)
    if source is None:
        return new_cache()
    slabs: list[CacheLayerMixin] = []
    for index in range(layers):
        ref = layer(source, index).keys
        assert ref is not None
        shape = (len(caches), ref.shape[1], capacity, ref.shape[3])
        keys = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
        values = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
        for b, (cache, n) in enumerate(zip(caches, lengths, strict=True)):
            if n:
                row = layer(cache, index)
                assert row.keys is not None and row.values is not None
                keys[b, :, past - n : past] = row.keys[0]
                values[b, :, past - n : past] = row.values[0]
        slabs.append(SlabLayer(keys, values, length=past))
    return Cache(layers=slabs)


def copy_row(batch: Cache, row: int, spans: list[tuple[int, int]], into: Cache, layers: int) -> None:
    """Append row ``row``'s columns ``spans`` (``[start, end)`` each, in order) of ``batch`` to ``into``."""
    for index in range(layers):
        src = layer(batch, index)
        assert src.keys is not None and src.values is not None
        for start, end in spans:
            if end > start:
                into.update(src.keys[row : row + 1, :, start:end], src.values[row : row + 1, :, start:end], index)
