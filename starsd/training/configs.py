"""The model architectures: Llama decoders in float32 with tied input/output embeddings.

The target has a few million parameters; the draft is about ten times smaller, most of its parameters being
its embedding table. Both share the tokenizer, so their ``vocab_size`` is the tokenizer's size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one Llama decoder."""

    hidden_size: int  # width of the residual stream
    num_layers: int  # decoder blocks
    num_heads: int  # attention heads
    intermediate_size: int  # width of the SwiGLU feed-forward layer
    max_position_embeddings: int = 1024  # longest context the checkpoint accepts
    rope_theta: float = 10000.0
    initializer_range: float = 0.02  # std of the normal initialisation
    num_kv_heads: int | None = None  # key/value heads (grouped-query attention when fewer); None: num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The shipped pair (head size 64 and 32; feed-forward widths about 8/3 of the hidden size, as in Llama).
TARGET_SPEC = ModelSpec(hidden_size=192, num_layers=4, num_heads=3, intermediate_size=512)
DRAFT_SPEC = ModelSpec(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=176)


def llama_config(spec: ModelSpec, vocab_size: int, bos_token_id: int, eos_token_id: int, pad_token_id: int) -> Any:
    """A ``transformers.LlamaConfig`` for ``spec`` and a tokenizer of ``vocab_size`` ids."""
    from transformers import LlamaConfig

    # ``rope_theta`` is a field of 4.x's LlamaConfig; 5.x takes it as a legacy keyword and stores it in
    # ``rope_parameters`` (``{"rope_type": "default", "rope_theta": ...}``), so it goes in untyped.
    legacy: dict[str, Any] = {"rope_theta": spec.rope_theta}
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype="float32",
        **legacy,
    )


def build_model(spec: ModelSpec, vocab_size: int, bos_token_id: int, eos_token_id: int, pad_token_id: int) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` (seed torch first for a reproducible initialisation)."""
    from transformers import LlamaForCausalLM

    config = llama_config(spec, vocab_size, bos_token_id, eos_token_id, pad_token_id)
    model = LlamaForCausalLM(config)
    return model.float()


def count_parameters(model: Any) -> int:
    """Distinct parameters (a tied embedding is counted once)."""
    return sum(p.numel() for p in model.parameters())
