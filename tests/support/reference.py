"""The lossless checks' oracle: what the target alone produces."""

from __future__ import annotations

import torch

from starsd.checkpoints import LoadedModel


def autoregressive_reference(loaded: LoadedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding with the target alone through ``transformers``' own ``generate`` (tests' oracle)."""
    with torch.inference_mode():
        out = loaded.model.generate(
            torch.tensor([prompt], dtype=torch.long, device=loaded.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=loaded.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=loaded.eos_token_id,
            pad_token_id=loaded.eos_token_id if loaded.eos_token_id is not None else 0,
        )
    return [int(t) for t in out[0, len(prompt) :]]
