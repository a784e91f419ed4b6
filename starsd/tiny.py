"""Tiny random-initialised draft/target pairs for tests: ``starsd models tiny --out DIR``.

The pair shares the project's tokenizer (the shipped one in ``models/target``; if that is missing, one trained
on the fly on a slice of the standard library), so the servers accept it. The weights are random but chosen to
exercise every path of speculative decoding:

* the target is initialised with a large standard deviation (0.3), so its greedy output depends on the context
  and its distributions are peaked (near-uniform logits would make every prompt produce one repeated token);
* the draft is the target plus seeded noise (1.5% of each matrix's spread), so the two agree often but not
  always: greedy rounds accept some proposals and reject others (about half, measured on random prompts).

With ``vocab_mismatch=True`` the draft gets a different tokenizer and vocabulary size, a pair the servers must
refuse at start.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

from starsd.paths import models_dir
from starsd.training.configs import ModelSpec, build_model

# Files that make up a transformers fast tokenizer saved by starsd.training.tokenizer.save_tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

TINY_SPEC = ModelSpec(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    intermediate_size=128,
    max_position_embeddings=1024,
    initializer_range=0.3,
)
# The same shape with grouped-query attention (two query heads per key/value head, as Llama 3 has four).
TINY_GQA_SPEC = dataclasses.replace(TINY_SPEC, num_kv_heads=2)
# Relative std of the noise that turns the target's weights into the draft's.
DRAFT_NOISE = 0.015
# Files of the standard library used when no shipped tokenizer exists, and the fallback vocabulary size.
FALLBACK_FILES = 40
FALLBACK_VOCAB = 1024


class ModelPair(NamedTuple):
    """Checkpoint directories of a draft and a target."""

    draft: Path
    target: Path


def shipped_models_dir() -> Path:
    """The shipped ``draft/`` and ``target/`` (see :func:`starsd.paths.models_dir`)."""
    return models_dir()


def shipped_pair(root: Path | None = None) -> ModelPair:
    """The shipped draft and target; raises ``FileNotFoundError`` with the command that builds them."""
    root = shipped_models_dir() if root is None else root
    pair = ModelPair(draft=root / "draft", target=root / "target")
    for path in pair:
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"no checkpoint at {path}: the shipped pair lives in models/ of the repository; "
                "rebuild it with `starsd models train --out models`"
            )
    return pair


def _write_tokenizer(out_dir: Path, vocab_size: int | None) -> Any:
    """Write the project's tokenizer (``vocab_size=None``), or a freshly trained one of ``vocab_size`` ids,
    into ``out_dir``; returns the loaded ``transformers`` tokenizer."""
    from starsd.training.corpus import load_corpus
    from starsd.training.tokenizer import save_tokenizer, train_bpe
    from starsd.vocab import load_tokenizer

    shipped = shipped_models_dir() / "target"
    if vocab_size is None and (shipped / "tokenizer.json").is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (shipped / name).is_file():
                shutil.copyfile(shipped / name, out_dir / name)
        return load_tokenizer(out_dir)
    corpus = load_corpus(limit=FALLBACK_FILES)
    tok = train_bpe((d.text for d in corpus.train), vocab_size=vocab_size or FALLBACK_VOCAB)
    return save_tokenizer(tok, out_dir, model_max_length=TINY_SPEC.max_position_embeddings)


def _build(tokenizer: Any, spec: ModelSpec) -> Any:
    return build_model(
        spec,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


@torch.no_grad()
def perturbed_copy(model: Any, scale: float, gen: torch.Generator) -> Any:
    """A copy of ``model`` with Gaussian noise of ``scale`` times each matrix's std added (norms unchanged)."""
    twin = type(model)(model.config)
    twin.load_state_dict(model.state_dict())
    for param in twin.parameters():
        if param.dim() >= 2:
            param.add_(torch.randn(param.shape, generator=gen) * (param.std() * scale))
    return twin.eval()


def write_random_pair(
    out_dir: Path,
    seed: int = 0,
    vocab_mismatch: bool = False,
    draft_noise: float = DRAFT_NOISE,
    grouped_query: bool = False,
) -> ModelPair:
    """Write ``out_dir/draft`` and ``out_dir/target``: tiny random Llama checkpoints (about 0.2M parameters
    each) sharing one tokenizer; returns their paths as ``ModelPair(draft, target)``.

    The same ``seed`` gives the same weights. With ``vocab_mismatch`` the draft has its own, smaller tokenizer
    and vocabulary (a different :func:`starsd.vocab.vocab_fingerprint`). ``draft_noise`` sets how far the
    draft strays from the target (relative noise per matrix; larger: more disagreement). With
    ``grouped_query`` both use grouped-query attention (:data:`TINY_GQA_SPEC`: fewer key/value heads than
    query heads).
    """
    spec = TINY_GQA_SPEC if grouped_query else TINY_SPEC
    out_dir = Path(out_dir)
    pair = ModelPair(draft=out_dir / "draft", target=out_dir / "target")
    # Write into a temporary sibling and move into place, so a reader never sees a half-written pair.
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tiny-") as tmp:
        staging = ModelPair(draft=Path(tmp) / "draft", target=Path(tmp) / "target")
        target_tok = _write_tokenizer(staging.target, None)
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        target = _build(target_tok, spec).eval()
        if vocab_mismatch:
            draft_tok = _write_tokenizer(staging.draft, max(300, len(target_tok) // 2))
            torch.manual_seed(seed + 1)
            draft = _build(draft_tok, spec).eval()
        else:
            draft_tok = _write_tokenizer(staging.draft, None)
            draft = perturbed_copy(target, draft_noise, gen)
        target.save_pretrained(str(staging.target), safe_serialization=True)
        draft.save_pretrained(str(staging.draft), safe_serialization=True)
        for final, staged in zip(pair, staging, strict=True):
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
    return pair
