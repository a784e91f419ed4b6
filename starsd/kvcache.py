"""A key/value cache that writes into preallocated memory instead of concatenating on every step.

transformers' ``DynamicLayer`` appends by ``torch.cat``, copying the whole cache on every forward pass. For
a small draft model that copy (and the allocation) costs more than the model's own arithmetic. A
:class:`SlabLayer` keeps keys and values in a buffer ``[B, H, capacity, D]`` with room to grow (doubling),
so appending is one slice assignment, cropping is setting a length, and a batch of sessions can be laid out
in one buffer and copied back row by row.
"""

from __future__ import annotations

import inspect
import itertools
import threading
import weakref
from dataclasses import dataclass
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

        These are transformers 4.x's semantics, which :mod:`starsd.checkpoints` relies on (``cache.crop(keep)``,
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


def grown_shape(have: tuple[int, int], need: tuple[int, int], limit: int | None) -> tuple[int, int]:
    """The ``(slots, capacity)`` a :class:`SlotPool` reallocates to when it holds ``have`` and needs ``need``.

    A dimension that must grow at least doubles (so that growing is rare); a dimension that need not grow keeps
    its size. Neither grows past what ``slots * capacity <= limit`` allows (the doubling's slack is given up
    first, then the unneeded size), and never below ``need``: admission guarantees ``need`` fits the limit.
    """
    (have_s, have_c), (need_s, need_c) = have, need
    s = have_s if need_s <= have_s else max(need_s, 2 * have_s)
    c = have_c if need_c <= have_c else max(need_c, 2 * have_c)
    if limit is not None and s * c > limit:
        c = max(need_c, min(c, limit // max(s, 1)))
        s = max(need_s, min(s, limit // max(c, 1)))
        c = max(need_c, min(c, limit // max(s, 1)))
    return s, c


class SlotPool:
    """Every running session's keys and values in one buffer per layer: ``[slots, H, capacity, D]``.

    A session owns a slot (a row) and keeps its tokens' keys and values left-aligned in it, so a step over any
    set of sessions needs no copy of their caches: each forward pass writes its new keys in place
    (:meth:`step_cache`) and reads the rows it runs. Rolling back rejected drafts is the session's own length
    going down. The pool grows by reallocating (moving the live rows, which may renumber their slots) and never
    past ``limit`` slots x capacity tokens (None: unbounded). Thread-safe: slots are taken on the event loop and
    freed by their holders or by finalizers, while steps run on the model thread.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        limit: int | None = None,
    ) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device, self.limit = dtype, device, limit
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0
        self._index: dict[int, int] = {}  # a live slot's key -> its row
        self._extents: dict[int, int] = {}  # a live slot's key -> columns it has written
        self._keys = itertools.count()
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return len(self._index)

    def take(self) -> PoolSlot:
        """A free slot; freed by :meth:`PoolSlot.release` or when its handle is garbage-collected. Call it on the
        thread that runs the steps (it may reallocate, which moves rows)."""
        with self._lock:
            taken = set(self._index.values())
            row = next((i for i in range(self.slots) if i not in taken), None)
            if row is None:
                self._reallocate((self.used + 1, self._extent()))
                taken = set(self._index.values())
                row = next(i for i in range(self.slots) if i not in taken)
            key = next(self._keys)
            self._index[key] = row
            self._extents[key] = 0
        return PoolSlot(self, key)

    def free(self, key: int) -> None:
        with self._lock:
            self._index.pop(key, None)
            self._extents.pop(key, None)

    def reserve(self, capacity: int) -> None:
        """Make every slot hold at least ``capacity`` tokens (on the thread that runs the steps)."""
        with self._lock:
            if capacity > self.capacity:
                self._reallocate((self.used, max(capacity, self._extent())))

    def _extent(self) -> int:
        """Columns that some live slot has written: what a reallocation must keep."""
        return max(self._extents.values(), default=0)

    def _reallocate(self, need: tuple[int, int]) -> None:
        slots, capacity = grown_shape((self.slots, self.capacity), need, self.limit)
        if self.limit is not None and slots * capacity > self.limit:
            raise MemoryError(
                f"the key/value pool needs {need[0]} slots x {need[1]} tokens, over its limit of {self.limit} tokens"
            )
        live = sorted(self._index.items(), key=lambda item: item[1])  # (key, old row)
        compact = slots < self.slots
        moved = {key: (new if compact else old) for new, (key, old) in enumerate(live)}
        keep = min(capacity, self.capacity)
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        if live and keep:
            source = torch.tensor([old for _, old in live], device=self.device)
            dest = torch.tensor([moved[key] for key, _ in live], device=self.device)
        for store in (self.keys, self.values):
            for index in range(self.layers):
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if live and keep:
                    fresh[dest, :, :keep] = store[index][source, :, :keep]
                if index < len(store):
                    store[index] = fresh
                else:
                    store.append(fresh)
        self._index = moved  # the extents stay with their keys
        self.slots, self.capacity = slots, capacity

    def rows_of(self, slots: list[PoolSlot]) -> list[int]:
        """The pool rows the ``slots`` hold now (a reallocation may move them: ask after :meth:`reserve`)."""
        with self._lock:
            return [self._index[slot.key] for slot in slots]

    def step_cache(
        self, slots: list[PoolSlot], cached: list[int], widths: list[int], inputs: StepInputs | None = None
    ) -> Cache:
        """The cache of one forward pass over ``slots``: row ``b`` has ``cached[b]`` tokens in its slot and feeds
        ``widths[b]`` new ones, right-aligned in a feed of ``max(widths)`` (see :func:`step_inputs`). The pass
        writes each real token's keys and values at its slot's next columns, the padding's at the column after
        them (never attended), and attends columns ``[0, max(cached + widths))`` of its rows. ``inputs``: the
        pass's :func:`step_inputs` for these rows, built once for the step (built here when None). Call
        :meth:`reserve` first."""
        width = max(widths)
        length = max(c + w for c, w in zip(cached, widths, strict=True))
        if length >= self.capacity:
            raise ValueError(f"reserve({length + 1}) before this step: the pool holds {self.capacity} tokens a slot")
        with self._lock:
            rows = [self._index[slot.key] for slot in slots]
            for slot, c, w in zip(slots, cached, widths, strict=True):
                self._extents[slot.key] = max(self._extents[slot.key], c + w + 1)
        if inputs is None:
            inputs = step_inputs(None, rows, cached, widths, self.device)
        first = rows[0]
        view = slice(first, first + len(rows)) if rows == list(range(first, first + len(rows))) else None
        single = (rows[0], cached[0]) if len(rows) == 1 else None
        where = _StepWhere(inputs.rows, inputs.columns, view, single, length, width)
        layers: list[Any] = [SlotStepLayer(self, index, where) for index in range(self.layers)]
        return Cache(layers=layers)


@dataclass(frozen=True)
class StepInputs:
    """What one forward pass over pool rows needs on the device, built from one host-to-device copy.

    Row ``b`` has ``cached[b]`` keys in its slot and feeds ``widths[b]`` tokens right-aligned in ``W = max(widths)``
    query positions; ``K = max(cached + widths)`` columns are attended.
    """

    input_ids: torch.Tensor | None  # [B, W] the fed tokens (None: the caller has them on the device already)
    rows: torch.Tensor  # [B] each row's slot in the pool
    columns: torch.Tensor  # [B, W] the column each fed position's key is written to
    positions: torch.Tensor  # [B, W] each query's position id (padding: 0)
    mask: torch.Tensor  # [B, 1, W, K] True: attend


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``: one copy, asynchronous from pinned memory on CUDA."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def step_inputs(
    feeds: list[list[int]] | None, rows: list[int], cached: list[int], widths: list[int], device: torch.device
) -> StepInputs:
    """The :class:`StepInputs` of a forward pass (``feeds``: each row's tokens, or None), uploaded in one copy.

    A real query attends its row's columns up to its own; a padding query attends only column 0 (always a real
    key), so that no attention row is empty (an empty one would make NaNs). A padding position's key is written
    at the column after its row's real ones, which no query of the row attends.
    """
    batch, width = len(rows), max(widths)
    total = max(c + w for c, w in zip(cached, widths, strict=True))
    packed = [*cached, *widths, *rows]
    if feeds is not None:
        for feed in feeds:
            packed.extend([0] * (width - len(feed)))
            packed.extend(feed)
    values = upload(packed, device)
    c, w, r = values[:batch].unsqueeze(1), values[batch : 2 * batch].unsqueeze(1), values[2 * batch : 3 * batch]
    input_ids = values[3 * batch :].view(batch, width) if feeds is not None else None
    offsets = torch.arange(width, device=device).unsqueeze(0)  # [1, W]
    pad = width - w  # [B, 1]
    real = offsets >= pad  # [B, W]
    positions = torch.where(real, c + offsets - pad, 0)  # [B, W]: each query's own column
    columns = torch.where(real, positions, c + w)  # [B, W]: where each position's key goes
    keys = torch.arange(total, device=device)  # [K]
    mask = keys[None, None, :] <= positions[:, :, None]  # [B, W, K]
    mask &= real[:, :, None] | (keys == 0)[None, None, :]
    return StepInputs(input_ids, r, columns, positions, mask.unsqueeze(1))


class PoolSlot:
    """A session's slot in a :class:`SlotPool` (its row may move when the pool reallocates)."""

    def __init__(self, pool: SlotPool, key: int) -> None:
        self.key = key
        self._finalizer = weakref.finalize(self, pool.free, key)

    def release(self) -> None:
        self._finalizer()


@dataclass(frozen=True)
class _StepWhere:
    rows: torch.Tensor  # [B]: each row's slot (on the device)
    columns: torch.Tensor  # [B, W]: each fed position's column
    view: slice | None  # the step's rows as one slice of the pool, when they are consecutive
    single: tuple[int, int] | None  # a step of one row: (its row, its first new column)
    length: int  # columns attended
    width: int  # positions fed


class SlotStepLayer(DynamicLayer):
    """One layer of a :meth:`SlotPool.step_cache`: writes into the pool, reads the step's rows.

    Everything it indexes with is on the device already (built once per step by :func:`step_inputs`), so a
    layer neither builds a tensor nor waits for the host.
    """

    def __init__(self, pool: SlotPool, index: int, where: _StepWhere) -> None:
        super().__init__()
        self.pool, self.index, self.where = pool, index, where
        self.dtype, self.device = pool.dtype, pool.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        where = self.where
        keys, values = self.pool.keys[self.index], self.pool.values[self.index]
        if where.single is not None:  # one row, no padding: a slice, not a scatter
            row, start = where.single
            end = start + where.width
            keys[row, :, start:end] = key_states[0]
            values[row, :, start:end] = value_states[0]
            return keys[row : row + 1, :, :end], values[row : row + 1, :, :end]
        rows = where.rows.unsqueeze(1)  # [B, 1], broadcast against columns [B, W]
        keys[rows, :, where.columns] = key_states.transpose(1, 2)  # [B, W, H, D]
        values[rows, :, where.columns] = value_states.transpose(1, 2)
        if where.view is not None:  # consecutive slots: the pool's own memory, no copy
            return keys[where.view, :, : where.length], values[where.view, :, : where.length]
        return (
            keys[:, :, : where.length].index_select(0, where.rows),
            values[:, :, : where.length].index_select(0, where.rows),
        )

    def get_seq_length(self) -> int:
        return self.where.length - self.where.width


POOL_ATTENTION = "starsd_sdpa"  # the attention implementation the runners switch their models to


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention without ``repeat_kv``: ``query [B, Hq, W, D]`` attends ``key``/``value``
    ``[B, Hkv, K, D]`` as the pool returns them, grouped-query heads shared through SDPA's ``enable_gqa`` (which
    transformers uses only without a mask, and every batched step has one). Returns ``[B, W, Hq, D]``."""
    q_length = query.shape[2]
    causal = bool(
        q_length > 1
        and attention_mask is None
        and (getattr(module, "is_causal", True) if is_causal is None else is_causal)
    )
    extra = {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, **extra
    )
    return out.transpose(1, 2).contiguous(), None


def use_pool_attention(model: Any) -> None:
    """Switch ``model`` from transformers' SDPA attention to :func:`grouped_sdpa_attention` (same masks, no
    repeated keys and values); other implementations (eager, flash) are left alone."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(POOL_ATTENTION, grouped_sdpa_attention)
    AttentionMaskInterface.register(POOL_ATTENTION, sdpa_mask)
    model.set_attn_implementation(POOL_ATTENTION)
