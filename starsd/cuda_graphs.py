"""CUDA graphs for the draft's decoding step and the target's verify step: ``--cuda-graphs auto|on|off`` (auto:
on with CUDA), one implementation for both (:class:`StepGraphs`).

Eager ``transformers`` on a GPU is bound by kernel launches: a small draft's decoding step is a few hundred
tiny kernels, each launched from Python. A CUDA graph records one step's kernels once and replays them with one
launch. A graph has fixed shapes and fixed memory, so steps are grouped into buckets: the batch is padded to the
next of :data:`BATCH_BUCKETS` (padding rows feed token 0 into a scratch slot of the pool that no session owns)
and the attended columns to the next multiple of :data:`LENGTH_STEP` (the mask hides the extra columns); the
fed width (1 for a draft's decoding step, ``gamma + 1`` for a target's verify step) is part of a bucket's key,
never padded. Each
bucket is captured on first use, checked once against the eager step, and replayed from static input buffers;
a step outside the buckets, a pool that reallocated (the graphs point at its old memory) or a failed check runs
eagerly. On the CPU the mode is always off.

The capture check compares the replay with an eager run of the same padded inputs. In fp32 they agree to 1e-4.
In bf16 and fp16 every hidden state is rounded to 8 (11) significand bits, so two runs whose kernels sum in
another order (cuBLAS may pick other algorithms under capture) differ by roundings of their inputs, and a logit
is a dot product over thousands of them: its error follows the scale of the logits, not its own size. One unit
in the last place of a bf16 logit in [8, 16) is 0.0625, more than twice the absolute 0.03 this check used to
allow, which refused a bf16 draft's replay at B = 64 that differed by 0.0547. The bound is therefore
:data:`CHECK_ULPS` unit in the last place of the largest eager logit, never below :data:`CHECK_TOLERANCE`'s
absolute floor (:func:`check_tolerance`): still far below the differences a wrong replay makes (stale inputs,
another row's keys: whole logits). A failed check makes every later step of the runner eager.

Memory per captured bucket (batch ``B``, width ``W``, length ``L``): the static inputs (a few KB), the logits
``[B, keep, V]`` in the model's dtype, and the step's activations, chiefly the attended keys and values gathered
for its rows, ``2 * layers * B * kv_heads * L * head_dim`` elements (for a Llama-3.2-1B draft in bf16 at B = 32,
L = 1024: 1 GiB; for a Llama-3.1-8B target, 32 layers x 8 kv heads x 128, at B = 32, L = 1024: 4 GiB), plus
``B * W`` rows of hidden states per layer (small beside them for W <= 8); the graphs share one memory pool, so
the largest bucket's activations bound the total, not their sum.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

MODES = ("auto", "on", "off")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # batch sizes captured (a larger batch runs eagerly)
LENGTH_STEP = 256  # attended columns are padded to a multiple of this
MAX_WIDTH = 16  # a target's passes of at most this many positions per row are captured (wider: prompt chunks)
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}  # replay vs eager: floor
SIGNIFICAND_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}
CHECK_ULPS = 1  # replay vs eager: units in the last place of the largest eager logit

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


def padded_length(length: int, step: int = LENGTH_STEP) -> int:
    """The attended columns of the bucket that ``length`` columns fall in: the next multiple of ``step``."""
    return max(step, math.ceil(length / step) * step)


def length_bucket(length: int, capacity: int, step: int = LENGTH_STEP) -> int | None:
    """The attended columns a graph for ``length`` columns attends (a multiple of ``step``), or None when the
    pool's ``capacity`` cannot hold it (the step runs eagerly)."""
    padded = padded_length(length, step)
    return padded if padded <= capacity else None


def reserve_bucket(pool: Any, need: int) -> None:
    """Grow ``pool`` (a :class:`starsd.kvcache.SlotPool`) to the length bucket that ``need`` columns fall in, so
    that a graph can attend it: a pool reserved for exactly ``need`` is smaller than its bucket, and every step
    would run eagerly. Where the pool's bound leaves no room it stays as it is and the step runs eagerly."""
    padded = padded_length(need)
    if padded > pool.capacity:
        with contextlib.suppress(MemoryError):
            pool.reserve(padded)


def check_tolerance(dtype: torch.dtype, scale: float) -> float:
    """How far a replay's logits may be from the eager step's, where the largest eager logit is ``scale`` in
    magnitude: :data:`CHECK_ULPS` units in the last place of ``scale`` in ``dtype``, at least the dtype's floor."""
    floor = CHECK_TOLERANCE.get(dtype, 3e-2)
    if not math.isfinite(scale) or scale <= 0:
        return floor
    ulp = 2.0 ** (math.floor(math.log2(scale)) - (SIGNIFICAND_BITS.get(dtype, 8) - 1))
    return max(floor, CHECK_ULPS * ulp)


@dataclass(frozen=True)
class PaddedInputs:
    """A step's inputs padded to a bucket: ``tokens [B, W]``, ``rows [B]``, ``positions [B, W]``, ``mask
    [B, 1, W, L]`` and ``columns [B, W]`` (where each fed position's key is written)."""

    tokens: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    columns: torch.Tensor


DecodeInputs = PaddedInputs  # a draft's decoding step: W = 1, columns = positions


def pad_step_inputs(
    tokens: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    columns: torch.Tensor,
    mask: torch.Tensor,
    batch: int,
    length: int,
    scratch_row: int,
) -> PaddedInputs:
    """Pad one step of ``B`` rows feeding ``W`` positions (``tokens [B, W]``, ``rows [B]``, ``positions [B, W]``,
    ``columns [B, W]``, ``mask [B, 1, W, K]``) to ``batch`` rows and ``length`` columns: extra columns are masked
    out, and extra rows feed token 0 at position 0 of ``scratch_row``, writing its columns ``0..W-1`` and
    attending column 0 only (their keys land in the scratch slot, their logits are dropped)."""
    b, width, k = tokens.shape[0], tokens.shape[1], mask.shape[-1]
    if b > batch or k > length:
        raise ValueError(f"a step of {b} rows x {k} columns does not fit the bucket {batch} x {length}")
    device = tokens.device
    out_tokens = torch.zeros(batch, width, dtype=tokens.dtype, device=device)
    out_tokens[:b] = tokens
    out_rows = torch.full((batch,), scratch_row, dtype=rows.dtype, device=device)
    out_rows[:b] = rows
    out_positions = torch.zeros(batch, width, dtype=positions.dtype, device=device)
    out_positions[:b] = positions
    out_columns = torch.arange(width, dtype=columns.dtype, device=device).repeat(batch, 1)
    out_columns[:b] = columns
    out_mask = torch.zeros(batch, 1, width, length, dtype=torch.bool, device=device)
    out_mask[:b, :, :, :k] = mask
    out_mask[b:, :, :, 0] = True
    return PaddedInputs(out_tokens, out_rows, out_positions, out_mask, out_columns)


def pad_decode_inputs(
    tokens: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    batch: int,
    length: int,
    scratch_row: int,
) -> PaddedInputs:
    """:func:`pad_step_inputs` for a decoding step: ``tokens [B]``, ``positions [B, 1]`` (also the write column),
    ``mask [B, 1, 1, K]``."""
    return pad_step_inputs(tokens.view(-1, 1), rows, positions, positions, mask, batch, length, scratch_row)


class _Graph:
    """One captured bucket: static inputs, the graph, its logits."""

    def __init__(self, static: PaddedInputs, graph: Any, logits: torch.Tensor, pool_memory: int) -> None:
        self.static, self.graph, self.logits, self.pool_memory = static, graph, logits, pool_memory


class StepGraphs:
    """Captured steps of a model over one :class:`starsd.kvcache.SlotPool`, by (batch, width, length, keep)
    bucket: a draft's decoding steps and a target's verify steps alike.

    :meth:`step_logits` returns the logits of a step's last ``keep`` positions ``[B, keep, V]`` from a replay
    (a view of the graph's static output, overwritten by the bucket's next replay), or None when the step must
    run eagerly. CUDA only (see :func:`graphs_enabled`); ``capture=False`` runs the padded step eagerly instead
    of capturing it (what a graph would replay, on any device: for tests).
    """

    def __init__(self, model: Any, pool: Any, role: str = "model", capture: bool = True) -> None:
        self.model, self.pool, self.role, self.capture = model, pool, role, capture
        self._scratch = pool.take()  # the padding rows' slot: owned by no session
        self._graphs: dict[tuple[int, int, int, int], _Graph] = {}
        self._memory = torch.cuda.graph_pool_handle() if capture else None
        self.disabled = False
        self.captures = 0  # buckets captured so far (again after the pool reallocated): a capture costs eager steps
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params

    def close(self) -> None:
        """Drop the graphs and give the scratch slot back to the pool; every later step runs eagerly."""
        self._graphs.clear()
        self.disabled = True
        self._scratch.release()

    def step_logits(
        self,
        tokens: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
        columns: torch.Tensor,
        mask: torch.Tensor,
        keep: int,
    ) -> torch.Tensor | None:
        if self.disabled:
            return None
        width = tokens.shape[1]
        batch = batch_bucket(tokens.shape[0])
        length = length_bucket(mask.shape[-1], self.pool.capacity)
        if batch is None or length is None or not 1 <= keep <= width:
            return None
        memory = self.pool.keys[0].data_ptr()
        if any(g.pool_memory != memory for g in self._graphs.values()):
            self._graphs.clear()  # the pool reallocated: the graphs read its old buffers
        scratch = self.pool.rows_of([self._scratch])[0]
        padded = pad_step_inputs(tokens, rows, positions, columns, mask, batch, length, scratch)
        if not self.capture:
            return self._forward(padded, keep)[: tokens.shape[0]]
        key = (batch, width, length, keep)
        graph = self._graphs.get(key)
        if graph is None:
            try:
                graph = self._capture(padded, keep, memory)
            except Exception as exc:  # a model or kernel that cannot be captured, a failed check: eager from now on
                log.warning("CUDA graph capture failed (%s); the %s steps run eagerly", exc, self.role)
                self.disabled = True
                return None
            self._graphs[key] = graph
            self.captures += 1
        for name in ("tokens", "rows", "positions", "mask", "columns"):
            getattr(graph.static, name).copy_(getattr(padded, name))
        graph.graph.replay()
        return graph.logits[: tokens.shape[0]]

    def _forward(self, static: PaddedInputs, keep: int) -> torch.Tensor:
        from starsd import kvcache

        cache = self.pool.static_step_cache(static.rows, static.columns, static.mask.shape[-1])
        kwargs: dict[str, Any] = {"logits_to_keep": keep} if self._logits_to_keep else {}
        out = self.model(
            input_ids=static.tokens,
            attention_mask=static.mask,
            position_ids=static.positions,
            use_cache=True,
            **kvcache.with_cache(cache),
            **kwargs,
        )
        logits: torch.Tensor = out.logits[:, -keep:]
        return logits

    def _capture(self, padded: PaddedInputs, keep: int, memory: int) -> _Graph:
        static = PaddedInputs(
            *(t.clone() for t in (padded.tokens, padded.rows, padded.positions, padded.mask, padded.columns))
        )
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, lazy initialisation)
                eager = self._forward(static, keep)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._memory):
            logits = self._forward(static, keep)
        graph.replay()
        scale = float(eager.float().abs().max())
        tolerance = check_tolerance(logits.dtype, scale)
        error = float((logits.float() - eager.float()).abs().max())  # once per bucket, at capture
        if not error <= tolerance:
            raise RuntimeError(
                f"replay differs from the eager step by {error:.3g} "
                f"(tolerance {tolerance:.3g} for logits up to {scale:.3g})"
            )
        return _Graph(static, graph, logits, memory)


class DecodeGraphs(StepGraphs):
    """The draft's captured decoding steps (width 1): :meth:`logits` gives the last position's ``[B, V]``."""

    def __init__(self, model: Any, pool: Any, capture: bool = True) -> None:
        super().__init__(model, pool, role="draft", capture=capture)

    def logits(self, tokens: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> Any:
        out = self.step_logits(tokens.view(-1, 1), rows, positions, positions, mask, keep=1)
        return None if out is None else out[:, -1]
