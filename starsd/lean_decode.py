"""A draft's forward pass without transformers' module machinery, for Llama-shaped models.

A small draft spends most of a decoding pass in Python: transformers' modules, their hooks, keyword handling and
output classes cost more than the arithmetic of a 2-layer model on a CPU, and as much as the kernels of a
larger one on a GPU without CUDA graphs. :class:`LeanDecoder` runs the same arithmetic from the model's own
weights: query, key and value projections in one matrix product, gate and up in another (the model's own
layers then use views of the fused matrices: the weights are not held twice), rotary tables looked up by
position on the device, keys and values written and read through the same
:class:`starsd.kvcache.SlotPool` step cache as the model's own pass. Nothing waits for the host.

On a CPU each operation costs a few microseconds of dispatch whatever its size, so the pass is written in as
few as it can be: 2-D products with the residual added in the same call (``addmm``), queries and keys rotated
together in three operations, and RMSNorm folded into the products that follow it. Llama's RMSNorm before a
projection ``W`` is ``(x / rms(x)) * g @ W.T`` with ``rms(x) = sqrt(mean(x**2) + eps)``; the pass keeps one more
column in the residual stream, a constant ``sqrt(n eps)`` (``n`` the hidden size) that every projection's zero
row ignores, so that ``rms(x) = |x'| / sqrt(n)`` is one vector norm of the stream ``x'``, and folds ``g sqrt(n)`` into
``W``: a normalised projection is ``(x' @ W') / |x'|``, two operations where the fused RMSNorm alone took more
time than the product. The model's own layers keep computing the same function from the same memory: their
weights become views of the folded matrices and their norms' weights ``1 / sqrt(n)``.

It is used for the draft only, where a different rounding changes at most which tokens are proposed, never what
the target outputs; the target always runs the model's own forward pass. Models it does not know exactly
(another architecture, biases, a rotary embedding that depends on the sequence length) keep the model's own pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# Rotary embeddings whose tables depend on the position only (so they can be computed once, up front).
_STATIC_ROPE = ("default", "linear", "llama3")


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's matrices, input-major: a row of the residual stream times a matrix is a product."""

    qkv: torch.Tensor  # [hidden + 1, (Hq + 2 Hkv) D]: the input norm folded in, the constant column's row zero
    out: torch.Tensor  # [Hq D, hidden + 1]: the constant column's column zero (the residual keeps it)
    gate_up: torch.Tensor  # [hidden + 1, 2 I]: the post-attention norm folded in
    down: torch.Tensor  # [I, hidden + 1]


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in ("llama", "mistral"):
        return f"model type {getattr(config, 'model_type', None)!r}"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "biases in attention or MLP"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "sliding_window", None):
        return "sliding-window attention"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in _STATIC_ROPE:
        return f"rotary embedding {getattr(rotary, 'rope_type', None)!r}"
    return None


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding ``x cos + rotate_half(x) sin`` in three operations: ``rotate_half(x)`` is the halves
    of ``x`` swapped with the first negated, and the negation is in ``signed_sin`` (``sin`` with its first half
    negated), so the swap is a roll."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def _fold_in(norm: torch.nn.Module, linears: list[torch.nn.Linear]) -> torch.Tensor:
    """``[hidden + 1, sum of outputs]``: the ``linears``' weights side by side, input-major, with ``norm``'s
    weight times ``sqrt(hidden)`` folded into their rows and a zero row for the constant column. The linears then
    use views of it and ``norm`` weighs by ``1 / sqrt(hidden)``: the model's function is unchanged."""
    weight: torch.Tensor = norm.weight  # type: ignore[assignment]  # an nn.Module attribute
    with torch.no_grad():
        hidden = weight.shape[0]
        root = math.sqrt(hidden)
        columns = [linear.weight.t() * (weight * root).unsqueeze(1) for linear in linears]
        folded = F.pad(torch.cat(columns, dim=1), (0, 0, 0, 1))  # the zero row
        start = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            linear.weight = torch.nn.Parameter(folded[:hidden, start : start + rows].t(), requires_grad=False)
            start += rows
        weight.fill_(1 / root)
    return folded


def _into_stream(linear: torch.nn.Linear) -> torch.Tensor:
    """``[inputs, hidden + 1]``: ``linear``'s weight input-major with a zero column for the constant (a product
    added to the stream leaves it as it is); the linear then uses a view of it."""
    with torch.no_grad():
        stream = F.pad(linear.weight.t(), (0, 1))  # the zero column
        linear.weight = torch.nn.Parameter(stream[:, :-1].t(), requires_grad=False)
    return stream


class LeanDecoder:
    """One decoding pass (one token per row) of a Llama-shaped causal LM from its weights."""

    def __init__(self, model: Any, max_positions: int) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"no lean decoding pass for this model: {reason}")
        config, inner = model.config, model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.scale = self.head_dim**-0.5
        hidden = int(config.hidden_size)
        self.embed = inner.embed_tokens.weight
        self.constant = math.sqrt(hidden * float(config.rms_norm_eps))  # the stream's last column
        with torch.no_grad():
            self.final = inner.norm.weight * math.sqrt(hidden)  # the last norm's weight (the head may be tied)
            self.lm_head = model.lm_head.weight.t()
        self.layers = [
            _Layer(
                _fold_in(
                    layer.input_layernorm, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]
                ),
                _into_stream(layer.self_attn.o_proj),
                _fold_in(layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj]),
                _into_stream(layer.mlp.down_proj),
            )
            for layer in inner.layers
        ]
        with torch.inference_mode():
            positions = torch.arange(max_positions, device=self.embed.device).unsqueeze(0)
            cos, sin = inner.rotary_emb(self.embed[:1].unsqueeze(0), positions)  # [1, P, D]
        half = self.head_dim // 2
        self.cos = cos[0]  # [P, D], in the model's dtype
        self.signed_sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)  # see _rotate

    def logits(
        self, tokens: torch.Tensor, positions: torch.Tensor | int, cache: Any, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``tokens [B, W]`` at ``positions [B, W]`` -> the last position's next-token logits ``[B, V]``; for one
        row, ``positions`` may be the position of its first fed token.

        ``cache``: a :meth:`starsd.kvcache.SlotPool.step_cache` of width ``W`` (it writes the new keys and returns
        the ``K`` keys to attend); ``mask [B, 1, W, K]`` (True: attend), or None for one row, whose ``W`` queries
        then attend causally the keys up to their own position."""
        batch, width = tokens.shape
        rows = batch * width
        # The residual stream [B W, hidden + 1]: every product is a 2-D one, the last column is the constant.
        h = F.pad(F.embedding(tokens.reshape(rows), self.embed), (0, 1), value=self.constant)
        if isinstance(positions, int):  # one row at consecutive positions: the tables' own rows, no lookup
            cos = self.cos[positions : positions + width][None, None]  # [1, 1, W, D]
            sin = self.signed_sin[positions : positions + width][None, None]
        else:
            cos = self.cos[positions].unsqueeze(1)  # [B, 1, W, D]
            sin = self.signed_sin[positions].unsqueeze(1)
        gqa = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        rotated = self.heads + self.kv_heads
        for index, layer in enumerate(self.layers):
            # The input norm and the projections: (h @ qkv) / |h| (see the module's docstring).
            qkv = torch.mm(h, layer.qkv).div_(torch.linalg.vector_norm(h, dim=-1, keepdim=True))
            # Queries and keys rotated together: [B, W, Hq + 2 Hkv, D] -> one rotation of the first Hq + Hkv heads.
            qkv = qkv.view(batch, width, rotated + self.kv_heads, self.head_dim)
            qk = _rotate(qkv[:, :, :rotated].transpose(1, 2), cos, sin)
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            v = qkv[:, :, rotated:].transpose(1, 2)
            keys, values = cache.layers[index].update(k, v)
            if mask is None and width > 1:  # one row: its queries are the last W of its keys
                columns = torch.arange(keys.shape[2], device=keys.device)
                if isinstance(positions, int):
                    fed = torch.arange(positions, positions + width, device=keys.device)
                else:
                    fed = positions[0]
                mask = (columns[None, :] <= fed[:, None]).view(1, 1, width, -1)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale, **gqa)
            h = torch.addmm(h, attn.transpose(1, 2).reshape(rows, self.heads * self.head_dim), layer.out)
            gate, up = torch.mm(h, layer.gate_up).div_(torch.linalg.vector_norm(h, dim=-1, keepdim=True)).chunk(2, -1)
            h = torch.addmm(h, F.silu(gate) * up, layer.down)
        last = h.view(batch, width, -1)[:, -1]  # [B, hidden + 1]
        norm = torch.linalg.vector_norm(last, dim=-1, keepdim=True)
        return torch.mm(last[:, :-1] * self.final, self.lm_head).div_(norm)
