"""How many key/value tokens a target can hold: the default of ``--kv-cache-tokens``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starsd import defaults

if TYPE_CHECKING:  # torch only when a budget is computed: the CLI imports this module's default
    import torch

DEFAULT_GPU_MEMORY_FRACTION = defaults.GPU_MEMORY_FRACTION  # --gpu-memory-fraction


def kv_geometry(config: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a decoder's key/value cache, from its config."""
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return int(config.num_hidden_layers), heads, head_dim


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Keys and values of one token over every layer: ``2 * layers * kv_heads * head_dim * element size``."""
    import torch

    layers, heads, head_dim = kv_geometry(config)
    return 2 * layers * heads * head_dim * torch.finfo(dtype).bits // 8


def kv_budget_tokens(loaded: Any, max_num_seqs: int, gpu_memory_fraction: float) -> int:
    """On CUDA, what ``gpu_memory_fraction`` of the GPU leaves after the weights (the key/value pool is the
    only copy of the caches); on the CPU, ``max_num_seqs`` full contexts (the host's memory is the operator's
    to size)."""
    import torch

    device = loaded.device
    if device.type != "cuda":
        context: int = loaded.max_context
        return max_num_seqs * context
    total = torch.cuda.get_device_properties(device).total_memory
    free_for_cache = total * gpu_memory_fraction - torch.cuda.memory_allocated(device)
    per_token = kv_bytes_per_token(loaded.model.config, loaded.placement.dtype)
    tokens = int(free_for_cache // per_token)
    if tokens < loaded.max_context:
        raise ValueError(
            f"--gpu-memory-fraction {gpu_memory_fraction} leaves room for {max(tokens, 0)} key/value tokens, "
            f"less than one context of {loaded.max_context}: raise it or use a smaller model"
        )
    return tokens
