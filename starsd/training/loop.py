"""The two training loops: language modelling for the target, distillation from the target for the draft.

The language-model loop draws windows of the corpus; the distillation loop takes any batches (the pipeline gives
it corpus windows joined with the target's own greedy text, from :func:`generate_greedy`). Both use AdamW with a
linear warm-up and a cosine decay, clip gradients, and return the loss of every step. Nothing in them draws
random numbers, so a seeded initialisation plus a seeded batch order gives the same weights on every run (for a
fixed number of torch threads on the same machine: a different thread count or CPU may change float rounding).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from starsd.progress import progress as progress_bar
from starsd.training.data import window_batches


@dataclass(frozen=True)
class TrainConfig:
    """One training run's schedule and batches."""

    steps: int  # optimiser steps
    batch_size: int  # windows per step
    seq_len: int  # tokens per window (inputs; labels are the same window shifted by one)
    lr: float  # peak learning rate
    warmup_steps: int  # linear warm-up from 0 to ``lr``
    min_lr_ratio: float = 0.1  # the cosine decays to ``lr * min_lr_ratio`` at the last step
    weight_decay: float = 0.1  # on matrices only (not on norms)
    grad_clip: float = 1.0  # max global gradient norm
    seed: int = 0  # seeds the batch order
    # Mixed precision: matrix products in bfloat16 under torch.autocast, weights and optimiser state in float32
    # (the saved checkpoints are float32). About twice as fast on CPUs with native bfloat16 (AVX512-BF16, AMX).
    bf16: bool = True

    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DistillWeights:
    """How the draft's loss mixes the target's soft and hard signals."""

    kl: float = 1.0  # KL(p_target || q_draft) over the whole vocabulary
    hard: float = 0.5  # cross-entropy towards the target's greedy token, which is what greedy drafting must hit


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine decay to ``lr * min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, cfg: TrainConfig, i: int) -> None:
    for group in opt.param_groups:
        group["lr"] = lr_at(i, cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()


def _progress(total: int, desc: str, enabled: bool) -> Any:
    return progress_bar(total, desc, unit="step", enabled=enabled)


def _autocast(cfg: TrainConfig) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=torch.bfloat16) if cfg.bf16 else contextlib.nullcontext()


def _fit(
    model: Any,
    batches: Iterable[torch.Tensor],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    cfg: TrainConfig,
    desc: str,
    progress: bool,
) -> list[float]:
    """The loop both trainings share: one optimizer step on ``loss_of`` each of ``cfg.steps`` batches, the loss
    and learning rate on the progress bar; ``model`` in training mode meanwhile. Returns every step's loss."""
    model.train()
    opt = make_optimizer(model, cfg)
    losses: list[float] = []
    with _progress(cfg.steps, desc, progress) as bar:
        for i, batch in enumerate(itertools.islice(batches, cfg.steps)):
            loss = loss_of(batch)
            _step(model, opt, loss, cfg, i)
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{lr_at(i, cfg):.2e}", refresh=False)
    model.eval()
    return losses


def language_model_loss(model: Any, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over a ``[B, T+1]`` batch."""
    inputs, labels = batch[:, :-1], batch[:, 1:]
    logits = model(input_ids=inputs).logits  # [B, T, V]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def train_language_model(
    model: Any, stream: np.ndarray, cfg: TrainConfig, desc: str = "target", progress: bool = True
) -> list[float]:
    """Train ``model`` to predict the next token of windows of ``stream``; returns the loss of every step."""

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        with _autocast(cfg):
            return language_model_loss(model, batch)

    batches = window_batches(stream, cfg.seq_len, cfg.batch_size, cfg.steps, cfg.seed)
    return _fit(model, batches, loss_of, cfg, desc, progress)


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, weights: DistillWeights
) -> torch.Tensor:
    """``kl * KL(p || q) + hard * CE(q, argmax p)`` averaged over positions (p: teacher, q: student).

    Both logits are ``[N, V]``. The KL term teaches the student the teacher's whole distribution (what
    sampled verification accepts); the hard term sharpens agreement on the teacher's greedy token (what greedy
    verification accepts).
    """
    log_q = F.log_softmax(student_logits, dim=-1)  # [N, V]
    log_p = F.log_softmax(teacher_logits, dim=-1)  # [N, V]
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    hard = F.nll_loss(log_q, teacher_logits.argmax(dim=-1))
    return weights.kl * kl + weights.hard * hard


def distill(
    student: Any,
    teacher: Any,
    batches: Iterable[torch.Tensor],
    cfg: TrainConfig,
    weights: DistillWeights = DistillWeights(),
    desc: str = "draft",
    progress: bool = True,
) -> list[float]:
    """Train ``student`` to match ``teacher``'s next-token distributions on ``batches`` (``[B, T+1]``; the
    last token of each window is not used); ``cfg`` gives the schedule, ``cfg.steps`` batches are consumed."""

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        inputs = batch[:, :-1]
        with _autocast(cfg):
            with torch.no_grad():
                teacher_logits = teacher(input_ids=inputs).logits.float()  # [B, T, V]
            student_logits = student(input_ids=inputs).logits.float()  # [B, T, V]
        vocab = student_logits.size(-1)
        return distillation_loss(student_logits.reshape(-1, vocab), teacher_logits.reshape(-1, vocab), weights)

    teacher.eval()
    return _fit(student, batches, loss_of, cfg, desc, progress)


@torch.no_grad()
def mean_loss(model: Any, batches: Iterable[torch.Tensor]) -> float:
    """Mean next-token cross-entropy of ``model`` over ``batches`` (evaluation; no gradients)."""
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        total += language_model_loss(model, batch).item() * batch[:, 1:].numel()
        count += batch[:, 1:].numel()
    return total / max(1, count)


@torch.no_grad()
def generate_greedy(
    model: Any, prompts: torch.Tensor, new_tokens: int, batch_size: int, desc: str = "generate", progress: bool = True
) -> torch.Tensor:
    """``model``'s greedy continuations of ``prompts`` (``[N, P]``), as ``[N, P + new_tokens]``.

    Generation does not stop at EOS (the model's argmax simply continues), so every row has the same length.
    Used to give the draft the contexts it will meet at inference time: the target's own greedy text.
    """
    model.eval()
    rows = []
    starts = range(0, prompts.size(0), batch_size)
    bar = progress_bar(len(starts), desc, unit="batch", enabled=progress)
    for i in starts:
        bar.update()
        chunk = prompts[i : i + batch_size]
        out = model.generate(
            chunk,
            attention_mask=torch.ones_like(chunk),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=model.config.pad_token_id,
        )
        rows.append(out)
    return torch.cat(rows, dim=0)


@torch.no_grad()
def project_embeddings(teacher: Any, student: Any) -> None:
    """Initialise ``student``'s input embedding (tied to its output layer) with ``teacher``'s, projected on
    the teacher's top principal directions: the draft starts out knowing which tokens are alike."""
    src = teacher.get_input_embeddings().weight.float()  # [V, H_teacher]
    dst = student.get_input_embeddings().weight  # [V, H_student]
    if src.size(0) != dst.size(0):
        raise ValueError(f"vocabularies differ: {src.size(0)} vs {dst.size(0)} ids")
    _, _, vh = torch.linalg.svd(src - src.mean(dim=0), full_matrices=False)  # vh: [H_teacher, H_teacher]
    dst.copy_(src @ vh[: dst.size(1)].T)
