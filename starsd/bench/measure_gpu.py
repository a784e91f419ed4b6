"""Measure an accelerator profile with StarSD's own runners: the draft's ``Tq(gamma, B)``, the target's
``Tp(gamma)`` and ``Tp1``. Run it where the accelerator is, for ``--profile-json``::

    starsd bench measure-gpu --draft llama-1b --target llama-8b --out gpu-profile.json

A model is a Llama shape with random weights (``llama-1b`` follows Llama-3.2-1B, ``llama-8b`` Llama-3.1-8B) or a
checkpoint directory. ``Tq(B)`` is one :meth:`DraftRunner.propose_batch` of B sessions, ``gamma`` greedy tokens
each, after the target rejected each first proposal and committed a token of its own (crop, feed one, draft);
``Tp`` one :meth:`TargetRunner.step` verifying ``gamma`` drafts, ``Tp1`` one step decoding one token. Sessions
start with ``--context`` cached tokens and gain one or more per repeat. Times are medians after warm-up with
the device synchronised, of the code the servers run (eager ``transformers``). ``alpha`` and ``Tc`` are given.
Only this module imports torch, and only when it runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from starsd.bench.profiles import Profile

if TYPE_CHECKING:
    from starsd.checkpoints import LoadedModel

# name -> Llama shape (hidden, intermediate, layers, heads, kv heads, vocab)
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "llama-1b": (2048, 8192, 16, 32, 8, 128256),  # Llama-3.2-1B
    "llama-3b": (3072, 8192, 28, 24, 8, 128256),  # Llama-3.2-3B
    "llama-8b": (4096, 14336, 32, 32, 8, 128256),  # Llama-3.1-8B
    "tiny": (64, 128, 2, 4, 2, 256),  # for tests on a CPU
}
MAX_POSITIONS = 8192  # of the random-weight shapes
WARMUP = 3  # untimed repeats


def describe(model: str) -> str:
    return f"{model} shape, random weights" if model in SHAPES else f"checkpoint {Path(model).name}"


def load_model(model: str, device: str, dtype: str) -> LoadedModel:
    """A shape with seeded random weights (no tokenizer: none is used), or a checkpoint as the servers load it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from starsd.checkpoints import LoadedModel, load_checkpoint
    from starsd.devices import resolve

    if model not in SHAPES:
        return load_checkpoint(model, device, dtype)
    placement = resolve(device, dtype)
    hidden, inter, layers, heads, kv, vocab = SHAPES[model]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=model == "llama-1b",
    )
    torch.manual_seed(0)
    with torch.device(placement.device):
        weights = LlamaForCausalLM(config).to(placement.dtype).eval()
    return LoadedModel(weights, None, model, vocab, "random", MAX_POSITIONS, None, placement)


def _timed(fn: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    for _ in range(WARMUP):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ids(loaded: LoadedModel, n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(loaded.vocab_size) for _ in range(n)]


def draft_round_seconds(loaded: LoadedModel, batch: int, args: argparse.Namespace, sync: Callable[[], None]) -> float:
    from starsd.draft.runner import DraftRunner
    from starsd.proposals import DraftRequest, SamplingParams

    runner, rng = DraftRunner(loaded), random.Random(batch)
    states = [runner.new_state(seed=i) for i in range(batch)]

    def propose(new: list[list[int]]) -> list[list[int]]:
        requests = [DraftRequest(s, t, args.gamma, SamplingParams(), 0) for s, t in zip(states, new, strict=True)]
        return [p.token_ids for p in runner.propose_batch(requests)]

    last = propose([_ids(loaded, args.context, rng) for _ in range(batch)])  # the prompts' prefill

    def round_() -> None:
        nonlocal last
        last = propose([[(p[0] + 1) % loaded.vocab_size] for p in last])  # the first proposal rejected

    return _timed(round_, sync, args.repeats)


def target_step_seconds(loaded: LoadedModel, args: argparse.Namespace, sync: Callable[[], None]) -> tuple[float, float]:
    from starsd.verifier.runner import StepRow, TargetRunner

    runner, rng = TargetRunner(loaded), random.Random(0)
    session = runner.new_session(_ids(loaded, args.context, rng))
    runner.step([StepRow(session, prefill=args.context - 1)])

    def verify() -> None:
        runner.step([StepRow(session, drafts=_ids(loaded, args.gamma, rng))])

    return _timed(verify, sync, args.repeats), _timed(lambda: runner.step([StepRow(session)]), sync, args.repeats)


def needed_positions(args: argparse.Namespace) -> int:
    """The context, then per round at most ``gamma + 1`` verified and one decoded token, and the last drafts."""
    return args.context + (args.repeats + WARMUP) * (args.gamma + 2) + args.gamma + 1


def measure(args: argparse.Namespace, progress: Callable[[str], None] = lambda _: None) -> Profile:
    """Load both models, time the draft's rounds at every batch size, then the target's steps; ``progress``
    hears each result."""
    import torch

    draft, target = (load_model(m, args.device, args.dtype) for m in (args.draft, args.target))
    for model, loaded in ((args.draft, draft), (args.target, target)):  # refused before anything is timed
        if needed_positions(args) > loaded.max_context:
            raise ValueError(
                f"{describe(model)} holds {loaded.max_context} positions; --context {args.context} "
                f"with --repeats {args.repeats} and --gamma {args.gamma} needs {needed_positions(args)}"
            )
    device = draft.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    progress(f"draft {describe(args.draft)} on {draft.placement.describe()}")
    curve: list[tuple[int, float]] = []
    for b in args.batches:
        t = draft_round_seconds(draft, b, args, sync)
        progress(f"  Tq(B={b}) {t * 1e3:.3f} ms")
        # Noise can make a larger batch look a hair faster; a batch never is, so the curve stays non-decreasing.
        curve.append((b, round(max(t, curve[-1][1]) if curve else t, 7)))
    progress(f"target {describe(args.target)} on {target.placement.describe()}")
    tp, tp1 = target_step_seconds(target, args, sync)
    progress(f"  Tp({args.gamma}) {tp * 1e3:.3f} ms, Tp1 {tp1 * 1e3:.3f} ms")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    models = "_".join(Path(x).name for x in (args.target, args.draft))
    return Profile(
        name=args.name or f"{name.lower().replace(' ', '-')}-{models}",
        draft=f"{describe(args.draft)}, {args.dtype}",
        target=f"{describe(args.target)}, {args.dtype}",
        hardware=f"{name}, batch 1 target, {args.context}-token context",
        gamma=args.gamma,
        tq=curve[0][1],
        tp=round(tp, 7),
        tc=args.tc,
        alpha=args.alpha,
        tp1=round(tp1, 7),
        kind="measured",
        source=f"starsd bench measure-gpu on {name} (torch {torch.__version__}, StarSD's draft and target runners)",
        derivation=(
            f"Medians of {args.repeats} timed repeats after warm-up, device synchronised: Tq(B) = one "
            f"DraftRunner.propose_batch of B sessions, {args.gamma} greedy tokens each after one committed token; "
            f"Tp = one TargetRunner.step verifying {args.gamma} drafts; Tp1 = one step decoding one token; "
            f"sessions start from {args.context} cached tokens. alpha and Tc are given, not measured."
        ),
        batch_curve=tuple(curve),
    )
