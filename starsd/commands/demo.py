"""``starsd demo``: the main job on the embedded default (what ``make demo`` runs)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from starsd.commands._common import add_gamma_arg, add_placement_args, fail, gamma_error, placement_error


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", type=int, default=4, help="target servers (default 4)")
    add_gamma_arg(parser)
    parser.add_argument("--requests", type=int, default=96, help="completions in the workload (default 96)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion (default 64)")
    parser.add_argument("--concurrency", type=int, default=8, help="completions in flight at once (default 8)")
    parser.add_argument("--models", type=Path, help="folder with draft/ and target/ (default: the shipped models)")
    add_placement_args(parser)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from starsd.demo import format_report, run_workload, wait_draft_state
    from starsd.local import LocalStar, StartError, default_models_dir, http_json

    models = args.models or default_models_dir()
    if not (models / "target" / "config.json").is_file() or not (models / "draft" / "config.json").is_file():
        return fail(f"no draft/ and target/ checkpoints under {models}; run `make models` to train them")
    if args.targets < 1 or args.requests < 1 or args.max_tokens < 1 or args.concurrency < 1:
        return fail("--targets, --requests, --max-tokens and --concurrency must be >= 1")
    if (problem := gamma_error(args.gamma)) is not None:
        return fail(problem)
    if (problem := placement_error(args)) is not None:
        return fail(problem)
    print(f"StarSD demo: 1 draft ({models / 'draft'}) serving {args.targets} targets ({models / 'target'}),")
    print(
        f"gamma {args.gamma}, {args.requests} greedy completions of {args.max_tokens} tokens, "
        f"{args.concurrency} in flight. All processes share this machine's {os.cpu_count()} CPU cores."
    )
    star = LocalStar(
        draft_model=models / "draft",
        target_model=models / "target",
        targets=args.targets,
        gamma=args.gamma,
        device=args.device,
        dtype=args.dtype,
    )
    print(f"starting the star (logs in {star.log_dir}) ...", flush=True)
    try:
        star.start()
    except StartError as exc:
        return fail(str(exc))
    try:
        run_workload(star.urls, len(star.urls), 8, len(star.urls))  # warm-up: first calls pay lazy set-up
        bar_off = not sys.stderr.isatty()  # a redirected log gets one plain line per phase, not a bar
        with tqdm(total=args.requests, desc="with the draft ", unit="req", disable=bar_off) as bar:
            with_draft = run_workload(star.urls, args.requests, args.max_tokens, args.concurrency, bar)
        if bar_off:
            print(f"with the draft: {args.requests} completions done", file=sys.stderr, flush=True)
        load = http_json(star.load_url)[1]
        star.kill_draft()
        wait_draft_state(star, connected=False)
        with tqdm(total=args.requests, desc="targets alone  ", unit="req", disable=bar_off) as bar:
            alone = run_workload(star.urls, args.requests, args.max_tokens, args.concurrency, bar)
        if bar_off:
            print(f"targets alone: {args.requests} completions done", file=sys.stderr, flush=True)
        print()
        print(format_report(with_draft, alone, load, args.targets))
        return 0 if with_draft.failures == 0 and alone.failures == 0 else 1
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the star")
        return 130
    finally:
        star.stop()
