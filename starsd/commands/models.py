"""``starsd models``: write a tiny random pair for tests, or train the shipped pair.

* ``starsd models tiny --out DIR [--seed S] [--vocab-mismatch]`` writes ``DIR/draft`` and ``DIR/target`` in
  about a second: random weights, one tokenizer (with ``--vocab-mismatch`` the draft gets another vocabulary,
  a pair the servers must refuse).
* ``starsd models train --out DIR`` runs the recipe in :mod:`starsd.training.pipeline` (CPU, deterministic,
  minutes) and writes ``DIR/target``, ``DIR/draft``, ``DIR/README.md`` and ``DIR/report.json``.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    tiny = sub.add_parser(
        "tiny",
        help="write a tiny random-initialised draft/target pair sharing one tokenizer (for tests)",
        description="Write DIR/draft and DIR/target: tiny random Llama checkpoints that share one tokenizer.",
    )
    tiny.add_argument("--out", type=Path, required=True, help="directory to write draft/ and target/ into")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    tiny.add_argument(
        "--vocab-mismatch",
        action="store_true",
        help="give the draft a different tokenizer and vocabulary size (a pair the servers must refuse)",
    )

    train = sub.add_parser(
        "train",
        help="train the shipped tokenizer, target and distilled draft on the Python standard library (CPU)",
        description=(
            "Train a byte-level BPE tokenizer, a target language model and a draft distilled from it on the "
            "Python standard library's sources; write DIR/target, DIR/draft, DIR/README.md and DIR/report.json."
        ),
    )
    train.add_argument("--out", type=Path, required=True, help="directory to write the checkpoints into")
    train.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a machine shared with other jobs one thread is the fastest; "
        "results are reproducible for a fixed thread count)",
    )
    train.add_argument(
        "--quick",
        action="store_true",
        help="a few steps on a slice of the corpus, to check the pipeline in about a minute (not for shipping)",
    )
    train.add_argument(
        "--fp32",
        action="store_true",
        help="train in float32 instead of bfloat16 autocast (for CPUs without native bfloat16; slower, and "
        "the weights differ from the shipped ones)",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if args.models_command == "tiny":
        from starsd.tiny import write_random_pair

        pair = write_random_pair(args.out, seed=args.seed, vocab_mismatch=args.vocab_mismatch)
        print(f"draft:  {pair.draft}")
        print(f"target: {pair.target}")
        return 0
    if args.models_command == "train":
        from starsd.training.pipeline import Recipe, quick_recipe, train_pair

        if args.threads < 1:
            log.error("--threads must be at least 1")
            return 2
        recipe = quick_recipe() if args.quick else Recipe()
        if args.fp32:
            recipe = replace(
                recipe,
                target_train=replace(recipe.target_train, bf16=False),
                draft_train=replace(recipe.draft_train, bf16=False),
            )
        report = train_pair(args.out, recipe, threads=args.threads, progress=not args.no_progress)
        ev, t, d = report.evaluation, report.models["target"], report.models["draft"]
        print(f"target: {t['parameters']:,} parameters, {t['safetensors_bytes'] / 1e6:.2f} MB -> {args.out / 'target'}")
        print(f"draft:  {d['parameters']:,} parameters, {d['safetensors_bytes'] / 1e6:.2f} MB -> {args.out / 'draft'}")
        print(
            f"greedy acceptance at gamma={ev['gamma']} on held-out text: {ev['per_token_acceptance']:.3f} per token, "
            f"mean accepted length {ev['mean_accepted_length']:.2f}"
        )
        print(f"training {report.seconds['training_total'] / 60:.1f} min, total {report.seconds['total'] / 60:.1f} min")
        print(f"report: {args.out / 'README.md'}")
        return 0
    raise AssertionError(f"unknown models action {args.models_command!r}")
