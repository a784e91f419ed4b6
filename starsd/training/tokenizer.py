"""A byte-level BPE tokenizer, trained with ``tokenizers`` and saved as a ``transformers`` fast tokenizer.

Byte-level means every string round-trips exactly (no unknown token, no normalisation). Encoding prepends
``BOS``, as the models were trained with each document starting with ``BOS`` and ending with ``EOS``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)  # ids 0, 1, 2, in this order


def special_id(tok: Tokenizer, token: str) -> int:
    """The id of a special token of ``tok`` (``tokenizers`` types ``token_to_id`` as ``int | None``)."""
    index = tok.token_to_id(token)
    if index is None:
        raise ValueError(f"the tokenizer has no {token!r} token")
    return index


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on ``texts`` (consumed in order); the same input gives the same tokenizer.

    ``vocab_size`` counts everything: the special tokens, the 256 byte symbols and the learned merges.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(SPECIAL_TOKENS) + len(alphabet):
        raise ValueError(f"vocab_size {vocab_size} is below the byte alphabet plus special tokens")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = special_id(tok, BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


# The chat template of the shipped models: they were trained on Python sources, so a conversation is written as
# Python comments, one line per message, and the assistant answers after its own comment line. Minimal, but it
# lets `POST /v1/chat/completions` run on the shipped pair.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}# {{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)


def to_transformers(tok: Tokenizer, model_max_length: int) -> Any:
    """Wrap a trained tokenizer as a ``PreTrainedTokenizerFast`` with its special tokens declared."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
        # The default clean-up rewrites " ." as "." and similar, which would break exact round trips.
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> Any:
    """Write ``tokenizer.json`` and its ``transformers`` config to ``out_dir``; returns the wrapped tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fast = to_transformers(tok, model_max_length)
    fast.save_pretrained(str(out_dir))
    return fast


def encode_documents(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, as the models see a document: ``BOS text EOS``."""
    eos_id = special_id(tok, EOS)
    return [[*enc.ids, eos_id] for enc in tok.encode_batch(texts)]
