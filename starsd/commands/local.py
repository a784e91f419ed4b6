"""``starsd local``: one draft (or D) and N targets on this machine, until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from starsd.commands._common import (
    add_api_key_args,
    add_cuda_graphs_arg,
    add_gamma_arg,
    add_placement_args,
    api_keys_or_error,
    fail,
    gamma_error,
    placement_error,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", type=int, default=4, help="how many target servers (default 4)")
    parser.add_argument(
        "--drafts",
        type=int,
        default=1,
        help="how many draft servers (default 1); with more, every target is given the list and picks its own",
    )
    add_gamma_arg(parser)
    parser.add_argument("--draft-model", type=Path, help="draft checkpoint (default: the shipped models/draft)")
    parser.add_argument("--target-model", type=Path, help="target checkpoint (default: the shipped models/target)")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    parser.add_argument("--log-dir", type=Path, help="where the processes' logs go (default: a temporary folder)")
    add_api_key_args(parser)
    add_placement_args(parser)
    add_cuda_graphs_arg(parser)


def run(args: argparse.Namespace) -> int:
    from starsd.local import LocalStar, StartError

    if args.targets < 1:
        return fail("--targets must be >= 1")
    if args.drafts < 1:
        return fail("--drafts must be >= 1")
    if (problem := gamma_error(args.gamma)) is not None:
        return fail(problem)
    if (problem := placement_error(args)) is not None:
        return fail(problem)
    keys = api_keys_or_error(args)
    if isinstance(keys, str):
        return fail(keys)
    star = LocalStar(
        draft_model=args.draft_model,
        target_model=args.target_model,
        targets=args.targets,
        drafts=args.drafts,
        gamma=args.gamma,
        host=args.host,
        log_dir=args.log_dir,
        device=args.device,
        dtype=args.dtype,
        api_keys=tuple(keys),
        cuda_graphs=args.cuda_graphs,
    )
    drafts = "1 draft" if args.drafts == 1 else f"{args.drafts} drafts"
    targets = "1 target" if args.targets == 1 else f"{args.targets} targets"
    print(f"starting {drafts} and {targets} (logs in {star.log_dir}) ...", flush=True)
    try:
        star.start()
    except StartError as exc:
        return fail(str(exc))
    if args.drafts == 1:
        print(f"draft    grpc://{star.draft_address}   load: {star.load_url}")
    else:
        for i, (address, load) in enumerate(zip(star.draft_addresses, star.load_urls, strict=True)):
            print(f"draft-{i}  grpc://{address}   load: {load}")
    for i, url in enumerate(star.urls):
        print(f"target-{i} {url}/v1/completions")
    if keys:
        print(f"the targets need 'Authorization: Bearer KEY' with one of the {len(keys)} API key(s) given")
    print("Ctrl-C stops them all.", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            dead = [p.name for p in [*star.draft_procs, *star.target_procs] if p is not None and not p.alive()]
            if dead:
                print(f"{', '.join(dead)} exited; stopping the star (logs in {star.log_dir})")
                return 1
        return 0
    finally:
        star.stop()
