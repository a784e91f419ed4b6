"""``starsd bench measure-gpu``: measure an accelerator profile where the accelerator is (see
:mod:`starsd.bench.measure_gpu`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from starsd.commands._common import positive_ints
from starsd.commands.bench.common import add_model_args, error, model_error, stderr_line

HELP = "measure Tq(B), Tp and Tp1 of StarSD's runners on this machine's accelerator into a profile JSON"
DESCRIPTION = (
    "Times the draft runner's batched rounds and the target runner's verify and decode steps "
    "(the code the servers run) on Llama-shaped models with random weights or on checkpoints, and writes a "
    "profile for `starsd plan --profile-json` and `starsd bench star --profile-json`. Acceptance (alpha) "
    "and transfer (Tc) are written as given."
)


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024, help="tokens already in the KV cache")
    parser.add_argument("--batches", type=positive_ints, default=(1, 2, 4, 8, 16, 32), help="draft batch sizes, with 1")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--alpha", type=float, default=0.7, help="acceptance to write into the profile (not measured)")
    parser.add_argument("--tc", type=float, default=0.0001, help="one-way transfer to write into the profile")
    parser.add_argument("--name", default=None, help="profile name (default: derived from the device and models)")
    parser.add_argument("--out", type=Path, required=True, help="write the profile JSON here")


def run(args: argparse.Namespace) -> int:
    from starsd.bench.measure_gpu import measure
    from starsd.bench.profiles import describe
    from starsd.checkpoints import ModelLoadError

    def refuse(why: str) -> int:
        return error(why, "measure-gpu")

    if min(args.gamma, args.context, args.repeats) < 1 or 1 not in args.batches:
        return refuse("--gamma, --context, --repeats >= 1; --batches must hold 1")
    if (problem := model_error(args)) is not None:
        return refuse(problem)
    args.batches = sorted(set(args.batches))
    try:
        profile = measure(args, stderr_line)
    except (ValueError, ModelLoadError) as exc:
        return refuse(str(exc))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile.to_dict(), indent=2))
    print(f"{describe(profile)}\n-> {args.out}")
    return 0
