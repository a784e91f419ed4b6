"""Model checkpoints: find one in a local directory, load it offline onto a device, check a draft/target pair.

Importing this module does not import torch or transformers (the draft's gRPC server process uses
:func:`checkpoint_dir` and :class:`ModelLoadError` without a model); loading does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starsd.devices import Placement, resolve
from starsd.vocab import vocab_fingerprint

if TYPE_CHECKING:
    import torch


class ModelLoadError(RuntimeError):
    """A checkpoint could not be loaded; the message says what to fix."""


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory, or a clear :class:`ModelLoadError` if it is not one (checked without torch)."""
    root = Path(path)
    if not root.is_dir():
        raise ModelLoadError(f"model path {str(root)!r} does not exist or is not a directory")
    if not (root / "config.json").is_file():
        raise ModelLoadError(
            f"model path {str(root)!r} is not a Hugging Face checkpoint: it has no config.json "
            f"(contents: {sorted(p.name for p in root.iterdir())[:10]})"
        )
    return root


@dataclass
class LoadedModel:
    """A causal LM and its tokenizer, loaded for inference."""

    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    name: str
    vocab_size: int  # rows of the output layer
    fingerprint: str  # digest of the tokenizer's vocabulary
    max_context: int
    eos_token_id: int | None
    placement: Placement = field(default_factory=lambda: resolve("cpu", "float32"))

    @property
    def device(self) -> torch.device:
        import torch  # torch-free at import: the draft's server process checks checkpoints with this module

        return torch.device(self.placement.device)


def set_threads(threads: int | None) -> None:
    """Bound torch's intra-op threads (several servers often share one machine)."""
    if threads is None:
        threads = int(os.environ.get("STARSD_TORCH_THREADS", "1"))
    import torch

    torch.set_num_threads(max(1, threads))


def load_checkpoint(path: str | Path, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    """Load a causal LM checkpoint from a local directory, offline (nothing is fetched from a hub), onto
    ``device`` in ``dtype`` (see :mod:`starsd.devices`; ``auto``: CUDA + bf16 when a GPU is visible)."""
    root = checkpoint_dir(path)
    try:
        placement = resolve(device, dtype)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers 5 draws a bar per load: noise in a server's log

    try:
        tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(root, local_files_only=True, dtype=placement.dtype)
        model.to(placement.device)
    except Exception as exc:  # transformers raises many types; the path and cause are what matter
        raise ModelLoadError(f"cannot load the checkpoint at {str(root)!r}: {exc}") from exc
    model.eval()
    config = model.config
    max_context = int(getattr(config, "max_position_embeddings", 0) or 2048)
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    if len(tokenizer) > vocab_size:
        raise ModelLoadError(
            f"checkpoint {str(root)!r}: the tokenizer has {len(tokenizer)} tokens but the model only {vocab_size}"
        )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=root.resolve().name,
        vocab_size=vocab_size,
        fingerprint=vocab_fingerprint(tokenizer),
        max_context=max_context,
        eos_token_id=tokenizer.eos_token_id,
        placement=placement,
    )


def check_same_vocabulary(draft: LoadedModel, target: LoadedModel) -> None:
    """Refuse a draft/target pair that does not share one tokenizer."""
    if draft.fingerprint != target.fingerprint or draft.vocab_size != target.vocab_size:
        raise ModelLoadError(
            "the draft and target models do not share a vocabulary "
            f"(draft {draft.name!r}: {draft.vocab_size} ids, fingerprint {draft.fingerprint}; "
            f"target {target.name!r}: {target.vocab_size} ids, fingerprint {target.fingerprint}); "
            "speculative decoding needs the same tokenizer on both sides"
        )
