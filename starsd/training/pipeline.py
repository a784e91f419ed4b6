"""The recipe for the shipped pair, end to end: ``starsd models train --out models``.

1. Read the corpus (:mod:`.corpus`) and train the tokenizer on its training split.
2. Train the target as a language model on the training split.
3. Train the draft by distillation from the target on the same text.
4. Save both as Hugging Face checkpoints (``OUT/target``, ``OUT/draft``), load them back from disk, and evaluate
   them on held-out files: loss, teacher-forced argmax agreement, and simulated greedy speculative decoding.
5. Write ``OUT/README.md`` and ``OUT/report.json`` with what was done and what was measured.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from starsd.progress import progress as progress_bar
from starsd.training.acceptance import AcceptanceStats, greedy_agreement, model_functions, speculative_greedy
from starsd.training.configs import DRAFT_SPEC, TARGET_SPEC, ModelSpec, build_model, count_parameters
from starsd.training.corpus import Corpus, load_corpus
from starsd.training.data import cycled_batches, joined_batches, token_stream, window_batches
from starsd.training.loop import (
    DistillWeights,
    TrainConfig,
    distill,
    generate_greedy,
    mean_loss,
    project_embeddings,
    train_language_model,
)
from starsd.training.tokenizer import BOS, EOS, PAD, encode_documents, save_tokenizer, special_id, train_bpe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalConfig:
    """The held-out evaluation."""

    gamma: int = 4  # draft tokens per simulated round
    prompts: int = 32  # prompts cut from held-out files
    prompt_tokens: int = 64  # tokens of held-out text per prompt (after BOS)
    new_tokens: int = 128  # tokens generated per prompt
    loss_batches: int = 8  # held-out windows for loss and agreement (batches of 8 x seq_len)
    seed: int = 1234


@dataclass(frozen=True)
class DistillData:
    """What the draft learns on: corpus windows, and the target's greedy continuations of corpus prompts.

    Greedy verification accepts a draft token when it equals the target's argmax in the context the target
    itself wrote, so the draft also trains on that text (with the target's distributions as labels).
    """

    generated_sequences: int = 512  # continuations generated once, then cycled through
    prompt_tokens: int = 32  # corpus tokens (after BOS) that start each continuation
    generated_per_batch: int = 4  # rows of each batch taken from the continuations (the rest: corpus windows)
    generation_batch: int = 64  # continuations generated per forward batch
    seed: int = 3


TARGET_TRAIN = TrainConfig(steps=700, batch_size=16, seq_len=256, lr=3e-3, warmup_steps=40, seed=1)
DRAFT_TRAIN = TrainConfig(steps=1600, batch_size=8, seq_len=256, lr=3e-3, warmup_steps=30, seed=2)
DISTILL_WEIGHTS = DistillWeights(kl=1.0, hard=1.0)
DISTILL_DATA = DistillData()
EVALUATION = EvalConfig()


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the shipped checkpoints."""

    vocab_size: int = 2048
    target: ModelSpec = TARGET_SPEC
    draft: ModelSpec = DRAFT_SPEC
    target_train: TrainConfig = TARGET_TRAIN
    draft_train: TrainConfig = DRAFT_TRAIN
    distill_weights: DistillWeights = DISTILL_WEIGHTS
    distill_data: DistillData = DISTILL_DATA
    evaluation: EvalConfig = EVALUATION
    seed: int = 0  # seeds the initialisation of both models
    # Start the draft's embedding from the target's, projected on its top principal directions.
    draft_embedding_from_target: bool = True
    corpus_files: int | None = None  # None: every file; N: the first N (quick runs)


def quick_recipe() -> Recipe:
    """A few steps on a slice of the corpus: checks the whole pipeline in about a minute (not for shipping)."""
    r = Recipe()
    return replace(
        r,
        vocab_size=512,
        target_train=replace(r.target_train, steps=20, warmup_steps=2, seq_len=128),
        draft_train=replace(r.draft_train, steps=20, warmup_steps=2, seq_len=128),
        distill_data=replace(r.distill_data, generated_sequences=8, generation_batch=8),
        evaluation=replace(r.evaluation, prompts=4, new_tokens=32, loss_batches=2),
        corpus_files=60,
    )


@dataclass
class Report:
    """What the pipeline measured; written as ``report.json`` and rendered into ``README.md``."""

    environment: dict[str, Any] = field(default_factory=dict)
    corpus: dict[str, Any] = field(default_factory=dict)
    tokenizer: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def _save(model: Any, tokenizer_fast: Any, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))  # safetensors: the default in 4.x, the only format in 5.x
    tokenizer_fast.save_pretrained(str(out_dir))


def _load(out_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out_dir), local_files_only=True, dtype=torch.float32)
    return model.eval()


def eval_prompts(held_out: list[list[int]], cfg: EvalConfig, bos_id: int) -> list[list[int]]:
    """``cfg.prompts`` prompts: BOS plus ``cfg.prompt_tokens`` tokens cut from held-out documents.

    Documents are taken in turn and the cut points drawn with a seeded generator, so the prompts are fixed.
    """
    docs = [d[1:] for d in held_out if len(d) > cfg.prompt_tokens + 2]  # drop each document's own BOS
    if not docs:
        raise ValueError("no held-out document is long enough for a prompt")
    gen = torch.Generator().manual_seed(cfg.seed)
    prompts = []
    for i in range(cfg.prompts):
        doc = docs[i % len(docs)]
        start = int(torch.randint(0, len(doc) - cfg.prompt_tokens, (1,), generator=gen))
        prompts.append([bos_id, *doc[start : start + cfg.prompt_tokens]])
    return prompts


def evaluate_acceptance(
    draft: Any, target: Any, prompts: list[list[int]], cfg: EvalConfig, eos_id: int | None, progress: bool
) -> AcceptanceStats:
    propose, verify = model_functions(draft, target)
    total = AcceptanceStats()
    bar = progress_bar(len(prompts), "acceptance", unit="prompt", enabled=progress)
    for prompt in prompts:
        bar.update()
        _, stats = speculative_greedy(prompt, cfg.new_tokens, cfg.gamma, propose, verify, eos_token_id=eos_id)
        total.merge(stats)
    return total


def target_continuations(target: Any, stream: np.ndarray, recipe: Recipe, bos_id: int, progress: bool) -> torch.Tensor:
    """The target's greedy continuations of corpus prompts, ``[N, draft seq_len + 1]``."""
    dd, cfg = recipe.distill_data, recipe.draft_train
    (windows,) = window_batches(stream, dd.prompt_tokens - 1, dd.generated_sequences, 1, seed=dd.seed)
    prompts = torch.cat([torch.full((windows.size(0), 1), bos_id), windows], dim=1)  # [N, P + 1]
    new_tokens = cfg.seq_len + 1 - prompts.size(1)
    return generate_greedy(target, prompts, new_tokens, dd.generation_batch, "target text", progress)


def distill_batches(stream: np.ndarray, generated: torch.Tensor, recipe: Recipe) -> Iterator[torch.Tensor]:
    """Each step's batch: corpus windows joined with rows of the target's continuations."""
    dd, cfg = recipe.distill_data, recipe.draft_train
    corpus_rows = cfg.batch_size - dd.generated_per_batch
    return joined_batches(
        window_batches(stream, cfg.seq_len, corpus_rows, cfg.steps, cfg.seed),
        cycled_batches(generated, dd.generated_per_batch, cfg.steps, cfg.seed),
    )


def train_pair(out: Path, recipe: Recipe = Recipe(), threads: int = 1, progress: bool = True) -> Report:
    """Run the whole recipe and write ``out/target``, ``out/draft``, ``out/report.json``, ``out/README.md``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    report = Report()
    report.environment = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": threads,
        "machine": platform.machine(),
        "command": " ".join(["starsd", *sys.argv[1:]]) if sys.argv and "starsd" in sys.argv[0] else None,
    }
    started = time.perf_counter()

    # 1. Corpus and tokenizer.
    t0 = time.perf_counter()
    corpus: Corpus = load_corpus(limit=recipe.corpus_files)
    tok = train_bpe((d.text for d in corpus.train), vocab_size=recipe.vocab_size)
    max_len = max(recipe.target.max_position_embeddings, recipe.draft.max_position_embeddings)
    staging = out / "target"
    tokenizer_fast = save_tokenizer(tok, staging, model_max_length=max_len)
    train_docs = encode_documents(tok, [d.text for d in corpus.train])
    held_docs = encode_documents(tok, [d.text for d in corpus.held_out])
    train_stream, held_stream = token_stream(train_docs), token_stream(held_docs)
    ids = {"bos_token_id": special_id(tok, BOS), "eos_token_id": special_id(tok, EOS)}
    pad_id = special_id(tok, PAD)
    vocab = tok.get_vocab_size()
    report.corpus = {
        "root": str(corpus.root),
        "train_files": len(corpus.train),
        "held_out_files": len(corpus.held_out),
        "held_out_names": [d.name for d in corpus.held_out],
        "train_chars": corpus.train_chars(),
        "train_tokens": len(train_stream),
        "held_out_tokens": len(held_stream),
        "sha256": corpus.fingerprint(),
    }
    report.tokenizer = {"kind": "byte-level BPE", "vocab_size": vocab, "special_tokens": [BOS, EOS, PAD]}
    report.seconds["corpus_and_tokenizer"] = time.perf_counter() - t0
    log.info("corpus: %d training files, %d tokens; tokenizer: %d ids", len(corpus.train), len(train_stream), vocab)

    # 2. Target: language modelling.
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    target = build_model(recipe.target, vocab, pad_token_id=pad_id, **ids)
    target_losses = train_language_model(target, train_stream, recipe.target_train, "target", progress)
    report.seconds["target_training"] = time.perf_counter() - t0
    _save(target, tokenizer_fast, out / "target")

    # 3. Draft: distillation from the target, on corpus windows and on the target's own greedy text.
    t0 = time.perf_counter()
    generated = target_continuations(target, train_stream, recipe, ids["bos_token_id"], progress)
    report.seconds["target_generation"] = time.perf_counter() - t0
    torch.manual_seed(recipe.seed + 1)
    draft = build_model(recipe.draft, vocab, pad_token_id=pad_id, **ids)
    if recipe.draft_embedding_from_target:
        project_embeddings(target, draft)
    batches = distill_batches(train_stream, generated, recipe)
    draft_losses = distill(draft, target, batches, recipe.draft_train, recipe.distill_weights, "draft", progress)
    report.seconds["draft_distillation"] = time.perf_counter() - t0
    _save(draft, tokenizer_fast, out / "draft")
    report.seconds["training_total"] = time.perf_counter() - started

    # 4. Evaluate the checkpoints as written to disk.
    t0 = time.perf_counter()
    target, draft = _load(out / "target"), _load(out / "draft")
    ev = recipe.evaluation
    held_batches = list(window_batches(held_stream, recipe.target_train.seq_len, 8, ev.loss_batches, seed=ev.seed))
    prompts = eval_prompts(held_docs, ev, ids["bos_token_id"])
    stats = evaluate_acceptance(draft, target, prompts, ev, ids["eos_token_id"], progress)
    report.evaluation = {
        "gamma": ev.gamma,
        "prompts": len(prompts),
        "prompt_tokens": ev.prompt_tokens,
        "new_tokens_per_prompt": ev.new_tokens,
        "rounds": stats.rounds,
        "drafted_tokens": stats.drafted,
        "accepted_tokens": stats.accepted,
        "per_token_acceptance": stats.per_token_acceptance,
        "mean_accepted_length": stats.mean_accepted_length,
        "accepted_length_histogram": [stats.accepted_lengths.count(n) for n in range(ev.gamma + 1)],
        "teacher_forced_argmax_agreement": greedy_agreement(draft, target, held_batches),
        "held_out_loss_target": mean_loss(target, held_batches),
        "held_out_loss_draft": mean_loss(draft, held_batches),
    }
    report.seconds["evaluation"] = time.perf_counter() - t0

    for name, model, spec, cfg, losses in (
        ("target", target, recipe.target, recipe.target_train, target_losses),
        ("draft", draft, recipe.draft, recipe.draft_train, draft_losses),
    ):
        report.models[name] = {
            "parameters": count_parameters(model),
            "safetensors_bytes": (out / name / "model.safetensors").stat().st_size,
            "directory_bytes": _dir_bytes(out / name),
            "spec": spec.to_dict(),
        }
        report.training[name] = {
            "config": cfg.to_dict(),
            "tokens_seen": cfg.tokens(),
            "loss_first": losses[0],
            "loss_last_50_mean": float(np.mean(losses[-50:])),
        }
    report.training["draft"]["objective"] = asdict(recipe.distill_weights)
    report.training["draft"]["data"] = asdict(recipe.distill_data)
    report.training["draft"]["embedding_from_target"] = recipe.draft_embedding_from_target
    report.seconds["total"] = time.perf_counter() - started

    (out / "report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    (out / "README.md").write_text(render_readme(report))
    return report


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _spec_line(spec: dict[str, Any]) -> str:
    return (
        f"hidden {spec['hidden_size']}, {spec['num_layers']} layers, {spec['num_heads']} heads, "
        f"feed-forward {spec['intermediate_size']}, max positions {spec['max_position_embeddings']}"
    )


def _schedule_line(cfg: dict[str, Any], tokens: int) -> str:
    return (
        f"{cfg['steps']} steps x {cfg['batch_size']} windows x {cfg['seq_len']} tokens ({tokens:,} tokens), "
        f"AdamW peak lr {cfg['lr']:g}, {cfg['warmup_steps']} warm-up steps, cosine decay"
        + (", bfloat16 autocast (float32 weights)" if cfg.get("bf16") else ", float32")
    )


def render_readme(report: Report) -> str:
    """The models directory's README: how the checkpoints were made and what they measure."""
    t, d = report.models["target"], report.models["draft"]
    tt, dt = report.training["target"], report.training["draft"]
    ev, c, s, env = report.evaluation, report.corpus, report.seconds, report.environment
    obj, data = dt["objective"], dt["data"]
    corpus_rows = dt["config"]["batch_size"] - data["generated_per_batch"]
    hist = ", ".join(f"l={n}: {k}" for n, k in enumerate(ev["accepted_length_histogram"]))
    acceptance = f"**{ev['per_token_acceptance']:.3f}** ({ev['accepted_tokens']:,} / {ev['drafted_tokens']:,})"
    accepted_length = f"**{ev['mean_accepted_length']:.2f}** over {ev['rounds']:,} rounds"
    losses = f"{ev['held_out_loss_target']:.3f} / {ev['held_out_loss_draft']:.3f}"
    init = ""
    if dt["embedding_from_target"]:
        init = " Its embedding starts as the target's, projected on its top principal directions."
    lines = [
        "# The shipped model pair",
        "",
        "`target/` and `draft/` are complete Hugging Face checkpoints (Llama, float32, safetensors) sharing one",
        "tokenizer. They load offline from a local path:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("models/target")',
        'tokenizer = AutoTokenizer.from_pretrained("models/target")',
        "```",
        "",
        "They are small enough to run on a laptop CPU and are trained to show speculative decoding working, not",
        "to write good code. `starsd models train --out models` rebuilds them and writes this file and",
        "`report.json`; the numbers below come from the run that produced the committed files.",
        "",
        "## How they were made",
        "",
        f"* **Text**: the `.py` sources of the Python {env['python']} standard library, sorted by path; test",
        "  suites, `site-packages` and the generated codec tables in `encodings/` left out; files over 256 KiB",
        "  skipped. A file is held out for evaluation when a hash of its relative path says so (1 in 20):",
        f"  {c['train_files']} training files ({c['train_chars']:,} characters, {c['train_tokens']:,} tokens),",
        f"  {c['held_out_files']} held-out files ({c['held_out_tokens']:,} tokens).",
        f"  Corpus sha256 `{c['sha256'][:16]}` (over every file's path and text; see `report.json`).",
        "* **Tokenizer**: byte-level BPE trained with `tokenizers` on the training files,",
        f"  {report.tokenizer['vocab_size']} ids including `<|bos|>` (0), `<|eos|>` (1) and `<|pad|>` (2).",
        "  Encoding prepends `<|bos|>`; every training document is `<|bos|> text <|eos|>`. Byte-level: any",
        "  string round-trips exactly. A minimal chat template writes each message as a Python comment",
        "  (`# user: ...`) and the answer after `# assistant:`.",
        f"* **Target**: {_spec_line(t['spec'])}, tied embeddings: **{t['parameters']:,} parameters**.",
        f"  Trained as a language model: {_schedule_line(tt['config'], tt['tokens_seen'])}.",
        f"  Loss {tt['loss_first']:.2f} -> {tt['loss_last_50_mean']:.2f} (mean of the last 50 steps).",
        f"  Both models accept up to {t['spec']['max_position_embeddings']} positions but were trained on",
        f"  {tt['config']['seq_len']}-token windows: expect weaker text beyond that much context.",
        f"* **Draft**: {_spec_line(d['spec'])}, tied embeddings: **{d['parameters']:,} parameters**",
        f"  ({t['parameters'] / d['parameters']:.1f}x fewer than the target).{init}",
        "  Distilled from the target:",
        f"  loss = {obj['kl']:g} x KL(target || draft) + {obj['hard']:g} x cross-entropy towards the target's",
        f"  greedy token, on batches that join {corpus_rows} corpus windows with {data['generated_per_batch']} rows",
        f"  of the target's own greedy text ({data['generated_sequences']} continuations of",
        f"  {data['prompt_tokens']}-token training prompts, generated once and cycled through; greedy",
        "  verification compares the draft with the target's argmax in text the target wrote itself).",
        f"  {_schedule_line(dt['config'], dt['tokens_seen'])}.",
        f"  Loss {dt['loss_first']:.2f} -> {dt['loss_last_50_mean']:.2f} (mean of the last 50 steps).",
        "* **Determinism**: fixed seeds, a fixed batch order, `torch.use_deterministic_algorithms(True)`,",
        f"  {env['torch_threads']} torch thread(s), CPU only (torch {env['torch']}, {env['machine']}). The same",
        "  command on the same machine and software rebuilds identical files; another CPU or thread count",
        "  may round floats differently.",
        "",
        "## Sizes",
        "",
        "| | parameters | model.safetensors | directory |",
        "|---|---|---|---|",
        f"| target | {t['parameters']:,} | {_mb(t['safetensors_bytes'])} | {_mb(t['directory_bytes'])} |",
        f"| draft | {d['parameters']:,} | {_mb(d['safetensors_bytes'])} | {_mb(d['directory_bytes'])} |",
        "",
        "## Measured on held-out files",
        "",
        "Greedy speculative decoding, simulated as the servers run it (the committed text is the target's own",
        f"greedy output): {ev['prompts']} prompts of `<|bos|>` plus {ev['prompt_tokens']} tokens cut from",
        f"held-out files, {ev['new_tokens_per_prompt']} new tokens each, gamma = {ev['gamma']}.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| per-token acceptance (accepted / drafted) | {acceptance} |",
        f"| mean accepted length E[l] (of {ev['gamma']}; a round commits E[l] + 1 tokens) | {accepted_length} |",
        f"| rounds by accepted length l | {hist} |",
        f"| teacher-forced argmax agreement on held-out windows | {ev['teacher_forced_argmax_agreement']:.3f} |",
        f"| held-out loss (nats/token): target / draft | {losses} |",
        "",
        "How to read it: a model this small often falls into repeating itself under greedy decoding, and the",
        "draft learns those loops well (the rounds with l = gamma). The teacher-forced agreement, measured on",
        "real held-out text rather than on the target's own output, is the stricter number.",
        "",
        "## Time",
        "",
        f"On this machine ({env['torch_threads']} torch thread(s), shared with other jobs): corpus and tokenizer",
        f"{s['corpus_and_tokenizer']:.0f} s, target {s['target_training']:.0f} s, draft",
        f"{s['draft_distillation']:.0f} s (of which {s['target_generation']:.0f} s generating the target's",
        f"text): **training {s['training_total'] / 60:.1f} min**; evaluation {s['evaluation']:.0f} s;",
        f"total {s['total'] / 60:.1f} min.",
        "",
    ]
    return "\n".join(lines)
