"""Vocabulary fingerprints: how the servers tell whether a draft and a target share one tokenizer.

Speculative decoding exchanges token ids, so the draft's id ``i`` must be the target's id ``i``. Two tokenizers
agree when their token -> id maps and their special tokens agree; :func:`vocab_fingerprint` digests exactly
that, so comparing two short strings is enough (the draft can send its digest over the wire).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Special-token roles that take part in the digest, besides the vocabulary itself.
_SPECIAL_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")


class VocabMismatchError(ValueError):
    """A draft and a target do not share one vocabulary; the message names both and what differs."""


def load_tokenizer(path: str | Path) -> Any:
    """Load the tokenizer of a local checkpoint directory, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def vocab_fingerprint(tokenizer_or_dir: Any) -> str:
    """sha256 (hex) over a tokenizer's sorted ``(token, id)`` pairs and its special tokens.

    Accepts a ``transformers`` tokenizer or a checkpoint directory (``str`` or ``Path``). The digest does not
    depend on the order in which the tokenizer lists its vocabulary, on file formatting or on where the
    files live; it changes when any token, id or special token changes.
    """
    tok = load_tokenizer(tokenizer_or_dir) if isinstance(tokenizer_or_dir, str | Path) else tokenizer_or_dir
    vocab = sorted((str(token), int(i)) for token, i in tok.get_vocab().items())
    specials = {role: getattr(tok, role, None) for role in _SPECIAL_ROLES}
    payload = {
        "vocab": vocab,
        "special": {role: (None if t is None else str(t)) for role, t in specials.items()},
        "all_special": sorted(str(t) for t in tok.all_special_tokens),
    }
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def require_shared_vocab(draft: Any, target: Any) -> str:
    """Return the common fingerprint of two tokenizers (or checkpoint directories), or raise
    :class:`VocabMismatchError` with a message that says what differs."""
    d_tok = load_tokenizer(draft) if isinstance(draft, str | Path) else draft
    t_tok = load_tokenizer(target) if isinstance(target, str | Path) else target
    d_fp, t_fp = vocab_fingerprint(d_tok), vocab_fingerprint(t_tok)
    if d_fp != t_fp:
        d_name = str(draft) if isinstance(draft, str | Path) else "draft"
        t_name = str(target) if isinstance(target, str | Path) else "target"
        raise VocabMismatchError(
            f"the draft and the target do not share a vocabulary: draft {d_name} has {len(d_tok)} tokens "
            f"(fingerprint {d_fp[:16]}), target {t_name} has {len(t_tok)} tokens (fingerprint {t_fp[:16]}); "
            "use a draft trained with the target's tokenizer"
        )
    return d_fp
