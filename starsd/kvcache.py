"""The runners' key/value cache: every session's keys and values in one preallocated pool, written in place.

transformers' ``DynamicLayer`` appends by ``torch.cat``, copying the whole cache on every forward pass, and a
batch of sessions would need their caches copied into one batch. A :class:`SlotPool` keeps one buffer
``[slots, H, capacity, D]`` per layer; a session owns a slot (a row), a forward pass over any set of sessions
writes their new keys and values where they belong and attends their rows (:meth:`SlotPool.step_cache`), and
rolling back is a session's length going down. A pass's indices, positions and mask are built on the device
from one upload (:func:`step_inputs`), so no layer waits for the host; attention reads grouped-query keys as
stored (:func:`grouped_sdpa_attention`).
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

    def static_step_cache(self, rows: torch.Tensor, columns: torch.Tensor, length: int) -> Cache:
        """A step cache for a captured graph: rows ``rows [B]`` write at ``columns [B, W]`` and attend
        ``[0, length)``, all read from the given device tensors at every replay (no host-side case analysis)."""
        where = _StepWhere(rows, columns, None, None, length, columns.shape[1])
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
    # None for a pass of one row (no padding: the model's own causal mask and positions are right):
    columns: torch.Tensor | None  # [B, W] the column each fed position's key is written to
    positions: torch.Tensor | None  # [B, W] each query's position id (padding: 0)
    mask: torch.Tensor | None  # [B, 1, W, K] True: attend

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """The mask and position ids to pass the model (none for one row)."""
        if self.mask is None or self.positions is None:
            return {}
        return {"attention_mask": self.mask, "position_ids": self.positions}

    def next_token(self) -> StepInputs:
        """The inputs of the pass after this one when every row feeds one token right after its last position
        (a draft's decoding step), built on the device from these: no upload."""
        if self.positions is None:
            return StepInputs(None, self.rows, None, None, None)
        positions = self.positions[:, -1:] + 1  # [B, 1]
        assert self.mask is not None
        keys = torch.arange(self.mask.shape[-1] + 1, device=positions.device)  # one more column than before
        mask = (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)  # [B, 1, 1, K + 1]
        return StepInputs(None, self.rows, positions, positions, mask)


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``: one copy, asynchronous from pinned memory on CUDA."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def step_inputs(
    feeds: list[list[int]] | None,
    rows: list[int],
    cached: list[int],
    widths: list[int],
    device: torch.device,
    layout: bool = False,
) -> StepInputs:
    """The :class:`StepInputs` of a forward pass (``feeds``: each row's tokens, or None), uploaded in one copy.

    A real query attends its row's columns up to its own; a padding query attends only column 0 (always a real
    key), so that no attention row is empty (an empty one would make NaNs). A padding position's key is written
    at the column after its row's real ones, which no query of the row attends. A pass of one row gets no
    mask, positions or columns unless ``layout`` asks for them.
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
    if batch == 1 and not layout:
        return StepInputs(input_ids, r, None, None, None)
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
    columns: torch.Tensor | None  # [B, W]: each fed position's column (None for one row)
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
        assert where.columns is not None
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
