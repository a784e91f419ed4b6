"""Measure an accelerator profile: the draft's ``Tq(gamma, B)`` and the target's ``Tp(gamma)`` and ``Tp1``.

Run it where the accelerator is (random weights, so no checkpoint is needed)::

    starsd bench measure-gpu --draft llama-1b --target llama-8b --out gpu-profile.json

and use the result with ``starsd plan --profile-json`` or ``starsd bench star --profile-json``. Shapes follow
Llama-3.2-1B and Llama-3.1-8B; each timed step runs on a KV cache already holding ``--context`` tokens and
is cropped back afterwards, so every repeat sees the same context. Times are medians over ``--repeats``,
taken after warm-up with the device synchronised. The model runs eagerly in ``transformers`` (no CUDA graphs
unless ``--compile``), so a small draft's times include kernel-launch overhead that a tuned engine avoids:
read them as an upper bound. Acceptance cannot be measured on random weights: ``alpha`` is written as given.

Only this module imports torch, and only when it runs: the rest of the benchmark stays light.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

# name -> Llama shape (hidden, intermediate, layers, heads, kv heads, vocab)
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "llama-1b": (2048, 8192, 16, 32, 8, 128256),  # Llama-3.2-1B
    "llama-3b": (3072, 8192, 28, 24, 8, 128256),  # Llama-3.2-3B
    "llama-8b": (4096, 14336, 32, 32, 8, 128256),  # Llama-3.1-8B
    "tiny": (64, 128, 2, 4, 2, 256),  # for tests on a CPU
}


def _build(shape: str, device: Any, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads, kv, vocab = SHAPES[shape]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=8192,
        tie_word_embeddings=shape == "llama-1b",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def _timed(fn: Any, sync: Any, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import DynamicCache

    from starsd import kvcache

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def prefill(model: Any, batch: int) -> Any:
        cache = DynamicCache()
        ids = torch.randint(0, model.config.vocab_size, (batch, args.context), device=device)
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, **kvcache.with_cache(cache))
        return cache

    def forward(model: Any, cache: Any, batch: int, tokens: int) -> None:
        ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=device)
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, **kvcache.with_cache(cache))

    results: dict[str, Any] = {}
    draft = _build(args.draft, device, dtype)
    if args.compile:
        draft.forward = torch.compile(draft.forward, mode="reduce-overhead")
    curve: list[tuple[int, float]] = []
    for b in args.batches:
        cache = prefill(draft, b)

        def draft_round(cache: Any = cache, b: int = b, m: Any = draft) -> None:
            for _ in range(args.gamma):  # gamma sequential steps of one token per sequence
                forward(m, cache, b, 1)
            cache.crop(-args.gamma)  # a negative count: what transformers 4 and 5 both accept

        curve.append((b, _timed(draft_round, sync, args.repeats)))
        del cache
    del draft
    if device.type == "cuda":
        torch.cuda.empty_cache()

    target = _build(args.target, device, dtype)
    if args.compile:
        target.forward = torch.compile(target.forward, mode="reduce-overhead")
    cache = prefill(target, 1)

    def verify() -> None:
        forward(target, cache, 1, args.gamma + 1)  # gamma drafts plus the position after them
        cache.crop(-(args.gamma + 1))

    def decode_one() -> None:
        forward(target, cache, 1, 1)
        cache.crop(-1)

    tp = _timed(verify, sync, args.repeats)
    tp1 = _timed(decode_one, sync, args.repeats)
    # Noise can make a larger batch look a hair faster; a batch never is, so keep the curve non-decreasing.
    monotone: list[tuple[int, float]] = []
    for b, t in curve:
        monotone.append((b, max(t, monotone[-1][1]) if monotone else t))
    results.update(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        raw_draft_curve=curve,
        batch_curve=monotone,
        tp=tp,
        tp1=tp1,
        torch=torch.__version__,
    )
    return results


def to_profile(args: argparse.Namespace, m: dict[str, Any]) -> dict[str, Any]:
    curve = [[b, round(t, 7)] for b, t in m["batch_curve"]]  # from B = 1: the unbatched service time
    device = m["device"]
    name = args.name or f"{device.lower().replace(' ', '-')}-{args.target}_{args.draft}"
    compiled = "torch.compile (CUDA graphs)" if args.compile else "eager transformers"
    return {
        "name": name,
        "draft": f"{args.draft} shape, random weights, {args.dtype}",
        "target": f"{args.target} shape, random weights, {args.dtype}",
        "hardware": f"{device}, batch 1 target, {args.context}-token context",
        "gamma": args.gamma,
        "tq": curve[0][1],
        "tp": round(m["tp"], 7),
        "tc": args.tc,
        "alpha": args.alpha,
        "tp1": round(m["tp1"], 7),
        "kind": "measured",
        "source": f"starsd.bench.measure_gpu on {device} (torch {m['torch']}, {compiled})",
        "derivation": (
            f"Medians of {args.repeats} timed repeats after warm-up, device synchronised: Tq(B) = {args.gamma} "
            f"sequential one-token draft steps for B sequences; Tp = one target pass over {args.gamma + 1} "
            f"tokens; Tp1 = one target decode step; all on a KV cache of {args.context} tokens. alpha "
            f"({args.alpha}) and Tc ({args.tc} s) are given, not measured (random weights, no network)."
        ),
        "batch_curve": curve,
    }
