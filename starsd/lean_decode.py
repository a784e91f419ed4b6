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
together in three operations, PyTorch's own RMSNorm in float32. On the tiny draft this cut a gamma-4 proposal
by 5-26% at batch 1-16 against the previous version of this pass (same proposals).

It is used for the draft only, where a different rounding changes at most which tokens are proposed, never what
the target outputs; the target always runs the model's own forward pass. Models it does not know exactly
(another architecture, biases, a rotary embedding that depends on the sequence length) keep the model's own pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# Rotary embeddings whose tables depend on the position only (so they can be computed once, up front).
_STATIC_ROPE = ("default", "linear", "llama3")


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, hidden]
    out: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, hidden]
    down: torch.Tensor


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


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, computed in float32 like the model's: one fused operation where the model is in float32."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding ``x cos + rotate_half(x) sin`` in three operations: ``rotate_half(x)`` is the halves
    of ``x`` swapped with the first negated, and the negation is in ``signed_sin`` (``sin`` with its first half
    negated), so the swap is a roll."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def _fuse(linears: list[torch.nn.Linear]) -> torch.Tensor:
    """The weights of ``linears`` stacked into one matrix, which each layer then uses a view of: one product
    instead of several, and no second copy of the weights."""
    with torch.no_grad():
        fused = torch.cat([linear.weight for linear in linears])
        start = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            linear.weight = torch.nn.Parameter(fused[start : start + rows], requires_grad=False)
            start += rows
    return fused


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
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.layers = [
            _Layer(
                layer.input_layernorm.weight,
                _fuse([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight,
                _fuse([layer.mlp.gate_proj, layer.mlp.up_proj]),
                layer.mlp.down_proj.weight,
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
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: Any, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``tokens [B, W]`` at ``positions [B, W]`` -> the last position's next-token logits ``[B, V]``.

        ``cache``: a :meth:`starsd.kvcache.SlotPool.step_cache` of width ``W`` (it writes the new keys and returns
        the ``K`` keys to attend); ``mask [B, 1, W, K]`` (True: attend), or None for one row, whose ``W`` queries
        then attend causally the keys up to their own position."""
        batch, width = tokens.shape
        rows = batch * width
        h = F.embedding(tokens.reshape(rows), self.embed)  # [B W, hidden]: every product is a 2-D one
        cos = self.cos[positions].unsqueeze(1)  # [B, 1, W, D]
        sin = self.signed_sin[positions].unsqueeze(1)
        gqa = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        rotated = self.heads + self.kv_heads
        for index, layer in enumerate(self.layers):
            x = _rms(h, layer.input_norm, self.eps)
            # Queries and keys rotated together: [B, W, Hq + 2 Hkv, D] -> one rotation of the first Hq + Hkv heads.
            qkv = torch.mm(x, layer.qkv.t()).view(batch, width, rotated + self.kv_heads, self.head_dim)
            qk = _rotate(qkv[:, :, :rotated].transpose(1, 2), cos, sin)
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            v = qkv[:, :, rotated:].transpose(1, 2)
            keys, values = cache.layers[index].update(k, v)
            if mask is None and width > 1:  # one row: its queries are the last W of its keys
                columns = torch.arange(keys.shape[2], device=keys.device)
                mask = (columns[None, :] <= positions[0, :, None]).view(1, 1, width, -1)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale, **gqa)
            h = torch.addmm(h, attn.transpose(1, 2).reshape(rows, self.heads * self.head_dim), layer.out.t())
            x = _rms(h, layer.post_norm, self.eps)
            gate, up = torch.mm(x, layer.gate_up.t()).chunk(2, dim=-1)
            h = torch.addmm(h, F.silu(gate) * up, layer.down.t())
        last = h.view(batch, width, -1)[:, -1]
        return torch.mm(_rms(last, self.norm, self.eps), self.lm_head.t())
