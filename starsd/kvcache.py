"""A key/value cache that writes into preallocated memory instead of concatenating on every step.

transformers' ``DynamicLayer`` appends by ``torch.cat``, copying the whole cache on every forward pass. For
a small draft model that copy (and the allocation) costs more than the model's own arithmetic. A
:class:`SlabLayer` keeps keys and values in a buffer ``[B, H, capacity, D]`` with room to grow (doubling),
so appending is one slice assignment, cropping is setting a length, and a batch of sessions can be laid out
in one buffer and copied back row by row.
"""

from __future__ import annotations

import inspect
from functools import cache as _memoize
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_CAPACITY = 64


@_memoize
def cache_arg() -> str:
    """The keyword a causal LM's ``forward`` takes its cache by: ``cache`` from transformers 5.x (where
    ``past_key_values`` is a deprecated alias with a ``FutureWarning``), ``past_key_values`` before.

    Passing ``cache=`` to a 4.x model would not fail: it would vanish into ``**kwargs`` and the model would run
    without the cache, so the name is looked up, not guessed.
    """
    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


def with_cache(cache: Cache) -> dict[str, Cache]:
    """``model(..., **with_cache(cache))`` passes ``cache`` under the installed transformers' keyword."""
    return {cache_arg(): cache}


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

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor | None = None) -> None:
        # transformers 4.x passes the keys only, 5.x the keys and values.
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The extra arguments (4.x: ``cache_kwargs``; 5.x: ``kwargs=`` the attention's keyword arguments) are unused.
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
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
        """Keep the first ``max_length`` tokens (``max_length < 0``: drop the last ``-max_length``).

        These are transformers 4.x's semantics, which :mod:`starsd.runners` relies on (``cache.crop(keep)``,
        ``keep`` possibly 0). transformers 5.x's ``DynamicLayer.crop`` only accepts a negative count and treats
        ``crop(0)`` as a no-op; a negative argument means the same under both.
        """
        if max_length < 0:
            max_length = self.length + max_length
        if self._k is not None and max_length < self.length:
            self._set_length(max(0, max_length))

    def reset(self) -> None:
        """Forget the cached tokens, keeping the buffer."""
        if self._k is not None:
            self._set_length(0)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:  # pragma: no cover - beam search is not used
        raise NotImplementedError("SlabLayer does not support beam search")

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
    slabs: list[Any] = []  # SlabLayers; transformers 4.x and 5.x annotate ``Cache(layers=...)`` differently
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
