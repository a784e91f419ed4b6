"""CUDA graphs for the draft's decoding step: ``--cuda-graphs auto|on|off`` (auto: on with CUDA).

Eager ``transformers`` on a GPU is bound by kernel launches: a small draft's decoding step is a few hundred
tiny kernels, each launched from Python. A CUDA graph records one step's kernels once and replays them with one
launch. A graph has fixed shapes and fixed memory, so steps are grouped into buckets: the batch is padded to the
next of :data:`BATCH_BUCKETS` (padding rows feed token 0 into a scratch slot of the pool that no session owns)
and the attended columns to the next multiple of :data:`LENGTH_STEP` (the mask hides the extra columns). Each
bucket is captured on first use, checked once against the eager step, and replayed from static input buffers;
a step outside the buckets, a pool that reallocated (the graphs point at its old memory) or a failed check runs
eagerly. On the CPU the mode is always off.

Memory per captured bucket (batch ``B``, length ``L``): the static inputs (a few KB), the logits ``[B, V]`` in
the model's dtype, and the step's activations, chiefly the attended keys and values gathered for its rows,
``2 * layers * B * kv_heads * L * head_dim`` elements (for a Llama-3.2-1B draft in bf16 at B = 32, L = 1024:
1 GiB); the graphs share one memory pool, so the largest bucket's activations bound the total.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

MODES = ("auto", "on", "off")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # batch sizes captured (a larger batch runs eagerly)
LENGTH_STEP = 256  # attended columns are padded to a multiple of this
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}  # replay vs eager, max abs

log = logging.getLogger(__name__)


def graphs_enabled(mode: str, device: torch.device) -> bool:
    """Whether ``--cuda-graphs mode`` captures graphs on ``device``; ``on`` without CUDA is an error."""
    if mode not in MODES:
        raise ValueError(f"--cuda-graphs must be one of {', '.join(MODES)}, got {mode!r}")
    cuda = device.type == "cuda"
    if mode == "on" and not cuda:
        raise ValueError(f"--cuda-graphs on needs a CUDA device; the model runs on {device}")
    return mode != "off" and cuda


def batch_bucket(batch: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int | None:
    """The smallest bucket that holds ``batch`` rows, or None when none does (the step runs eagerly)."""
    return next((b for b in sorted(buckets) if b >= batch), None)


def length_bucket(length: int, capacity: int, step: int = LENGTH_STEP) -> int | None:
    """The attended columns a graph for ``length`` columns attends (a multiple of ``step``), or None when the
    pool's ``capacity`` cannot hold it (the step runs eagerly)."""
    padded = max(step, math.ceil(length / step) * step)
    return padded if padded <= capacity else None


@dataclass(frozen=True)
class DecodeInputs:
    """A decoding step's inputs padded to a bucket: ``tokens [B, 1]``, ``rows [B]``, ``positions [B, 1]``
    (also each row's write column) and ``mask [B, 1, 1, L]``."""

    tokens: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor


def pad_decode_inputs(
    tokens: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    batch: int,
    length: int,
    scratch_row: int,
) -> DecodeInputs:
    """Pad one decoding step of ``B`` rows (``tokens [B]``, ``rows [B]``, ``positions [B, 1]``,
    ``mask [B, 1, 1, K]``) to ``batch`` rows and ``length`` columns: extra columns are masked out, and extra rows
    feed token 0 at position 0 of ``scratch_row`` attending column 0 only (their keys land in the scratch slot,
    their logits are dropped)."""
    b, k = tokens.shape[0], mask.shape[-1]
    if b > batch or k > length:
        raise ValueError(f"a step of {b} rows x {k} columns does not fit the bucket {batch} x {length}")
    device = tokens.device
    out_tokens = torch.zeros(batch, 1, dtype=tokens.dtype, device=device)
    out_tokens[:b, 0] = tokens
    out_rows = torch.full((batch,), scratch_row, dtype=rows.dtype, device=device)
    out_rows[:b] = rows
    out_positions = torch.zeros(batch, 1, dtype=positions.dtype, device=device)
    out_positions[:b] = positions
    out_mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device=device)
    out_mask[:b, :, :, :k] = mask
    out_mask[b:, :, :, 0] = True
    return DecodeInputs(out_tokens, out_rows, out_positions, out_mask)


class _Graph:
    """One captured bucket: static inputs, the graph, its logits."""

    def __init__(self, static: DecodeInputs, graph: Any, logits: torch.Tensor, pool_memory: int) -> None:
        self.static, self.graph, self.logits, self.pool_memory = static, graph, logits, pool_memory


class DecodeGraphs:
    """The draft's captured decoding steps over one :class:`starsd.kvcache.SlotPool`, by (batch, length) bucket.

    :meth:`logits` returns a step's last-position logits ``[B, V]`` from a replay, or None when the step must
    run eagerly. CUDA only (see :func:`graphs_enabled`).
    """

    def __init__(self, model: Any, pool: Any) -> None:
        self.model, self.pool = model, pool
        self._scratch = pool.take()  # the padding rows' slot: owned by no session
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._memory = torch.cuda.graph_pool_handle()
        self.disabled = False

    def logits(self, tokens: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> Any:
        if self.disabled:
            return None
        batch = batch_bucket(tokens.shape[0])
        length = length_bucket(mask.shape[-1], self.pool.capacity)
        if batch is None or length is None:
            return None
        memory = self.pool.keys[0].data_ptr()
        if any(g.pool_memory != memory for g in self._graphs.values()):
            self._graphs.clear()  # the pool reallocated: the graphs read its old buffers
        scratch = self.pool.rows_of([self._scratch])[0]
        padded = pad_decode_inputs(tokens, rows, positions, mask, batch, length, scratch)
        graph = self._graphs.get((batch, length))
        if graph is None:
            try:
                graph = self._capture(padded, memory)
            except Exception as exc:  # a model or kernel that cannot be captured: eager from now on
                log.warning("CUDA graph capture failed (%s); the draft decodes eagerly", exc)
                self.disabled = True
                return None
            self._graphs[(batch, length)] = graph
        for name in ("tokens", "rows", "positions", "mask"):
            getattr(graph.static, name).copy_(getattr(padded, name))
        graph.graph.replay()
        return graph.logits[: tokens.shape[0]]

    def _forward(self, static: DecodeInputs) -> torch.Tensor:
        from starsd import kvcache

        cache = self.pool.static_step_cache(static.rows, static.positions, static.mask.shape[-1])
        out = self.model(
            input_ids=static.tokens,
            attention_mask=static.mask,
            position_ids=static.positions,
            use_cache=True,
            **kvcache.with_cache(cache),
        )
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def _capture(self, padded: DecodeInputs, memory: int) -> _Graph:
        static = DecodeInputs(*(t.clone() for t in (padded.tokens, padded.rows, padded.positions, padded.mask)))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, lazy initialisation)
                eager = self._forward(static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._memory):
            logits = self._forward(static)
        graph.replay()
        tolerance = CHECK_TOLERANCE.get(logits.dtype, 3e-2)
        error = float((logits.float() - eager.float()).abs().max())  # once per bucket, at capture
        if not error <= tolerance:
            raise RuntimeError(f"replay differs from the eager step by {error:.3g} (tolerance {tolerance})")
        return _Graph(static, graph, logits, memory)
