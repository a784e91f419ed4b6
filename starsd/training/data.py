"""Token streams and batches: documents are concatenated into one stream, windows are drawn from it in an
order fixed by a seed (the only source of randomness in the data). Batches are ``[B, T+1]`` int64 tensors:
inputs are ``[:, :-1]`` and next-token labels ``[:, 1:]``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch


def token_stream(documents: Sequence[Sequence[int]]) -> np.ndarray:
    """Concatenate tokenised documents (each ``BOS ... EOS``) into one int64 array."""
    if not documents:
        raise ValueError("no documents to concatenate")
    return np.concatenate([np.asarray(doc, dtype=np.int64) for doc in documents])


def window_batches(stream: np.ndarray, seq_len: int, batch_size: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """``steps`` batches of ``batch_size`` windows of ``seq_len + 1`` tokens (inputs plus the shifted labels).

    Window starts are drawn uniformly with a generator seeded by ``seed``, so the same arguments give the same
    batches on every run.
    """
    if len(stream) <= seq_len + 1:
        raise ValueError(f"stream of {len(stream)} tokens is too short for windows of {seq_len + 1}")
    gen = torch.Generator().manual_seed(seed)
    data = torch.from_numpy(stream)
    span = seq_len + 1
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - span + 1, (batch_size,), generator=gen)
        yield torch.stack([data[s : s + span] for s in starts.tolist()])  # [B, T+1]


def cycled_batches(sequences: torch.Tensor, batch_size: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """``steps`` batches of rows of ``sequences`` (``[N, T+1]``), each pass over the rows in a fresh seeded
    order (the last partial batch of a pass is dropped)."""
    n = sequences.size(0)
    if n < batch_size:
        raise ValueError(f"{n} sequences are fewer than one batch of {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    produced = 0
    while True:
        order = torch.randperm(n, generator=gen)
        for i in range(0, n - batch_size + 1, batch_size):
            if produced == steps:
                return
            yield sequences[order[i : i + batch_size]]
            produced += 1


def joined_batches(*sources: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    """One batch from each source, stacked into one (all sources must have the same window length); stops
    when any source does."""
    for parts in zip(*sources, strict=False):
        yield torch.cat(parts, dim=0)
