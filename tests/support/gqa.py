"""A tiny draft/target pair with grouped-query attention (fewer key/value heads than query heads), and a vocabulary
small enough that exact distributions over it cost nothing.

The shipped and tiny pairs give every query head its own key/value head; most served models (Llama 3, Qwen,
Mistral) do not, and a cache that mixes up head groups still decodes, just wrongly. This pair is built from
the project's own pieces (:func:`llama_config` of :data:`starsd.tiny.TINY_SPEC`, a tokenizer saved by
:func:`starsd.training.tokenizer.save_tokenizer`, a draft that is the target plus relative noise) with
``num_key_value_heads < num_attention_heads`` and a word-level tokenizer of :data:`VOCAB` ids, so the servers
load and serve it like any other checkpoint.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch

from starsd.tiny import TINY_SPEC, ModelPair, perturbed_copy
from starsd.training.configs import llama_config
from starsd.training.tokenizer import SPECIAL_TOKENS, save_tokenizer

KV_HEADS = 2  # of TINY_SPEC's 4 query heads: groups of two
WORDS = (*string.ascii_lowercase, "aa", "bb", "cc")  # 29 words
VOCAB = len(SPECIAL_TOKENS) + len(WORDS)


def word_tokenizer() -> Any:
    """A ``tokenizers`` word-level tokenizer: the special tokens, then one id per word of :data:`WORDS`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *WORDS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS[2]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    return tok


def write_gqa_pair(
    out_dir: Path, seed: int = 0, draft_noise: float = 0.3, kv_heads: int = KV_HEADS, sharpness: float = 1.0
) -> ModelPair:
    """Write ``out_dir/draft`` and ``out_dir/target`` (the same seed, the same weights); ``draft_noise`` sets how
    far the draft strays from the target, ``sharpness`` scales the target's final norm, so its logits (larger:
    more peaked distributions)."""
    from transformers import LlamaForCausalLM

    if not 0 < kv_heads < TINY_SPEC.num_heads or TINY_SPEC.num_heads % kv_heads:
        raise ValueError(f"kv_heads must divide {TINY_SPEC.num_heads} and be smaller, got {kv_heads}")
    pair = ModelPair(draft=Path(out_dir) / "draft", target=Path(out_dir) / "target")
    tok = None
    for path in pair:
        tok = save_tokenizer(word_tokenizer(), path, model_max_length=TINY_SPEC.max_position_embeddings)
    assert tok is not None
    config = llama_config(TINY_SPEC, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    config.num_key_value_heads = kv_heads
    torch.manual_seed(seed)
    target = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        target.model.norm.weight.mul_(sharpness)
    draft = perturbed_copy(target, draft_noise, torch.Generator().manual_seed(seed + 1))
    target.save_pretrained(str(pair.target), safe_serialization=True)
    draft.save_pretrained(str(pair.draft), safe_serialization=True)
    return pair
