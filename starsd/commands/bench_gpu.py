"""``starsd bench measure-gpu``: measure an accelerator profile where the accelerator is (see
:mod:`starsd.bench.measure_gpu`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure_measure_gpu(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from starsd.bench.measure_gpu import SHAPES
    from starsd.commands.bench import _int_list

    p = sub.add_parser(
        "measure-gpu",
        help="measure Tq(B), Tp and Tp1 on this machine's accelerator into a profile JSON (random weights)",
        description="Times the draft's batched rounds and the target's verify and decode steps on Llama-shaped "
        "models with random weights, and writes a profile for `starsd plan --profile-json` and "
        "`starsd bench star --profile-json`. Acceptance (alpha) and transfer (Tc) are written as given.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--draft", choices=sorted(SHAPES), default="llama-1b")
    p.add_argument("--target", choices=sorted(SHAPES), default="llama-8b")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--context", type=int, default=1024, help="tokens already in the KV cache")
    p.add_argument("--batches", type=_int_list, default=(1, 2, 4, 8, 16, 32), help="draft batch sizes, with 1")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--compile", action="store_true", help="torch.compile(mode='reduce-overhead'): CUDA graphs")
    p.add_argument("--alpha", type=float, default=0.7, help="acceptance to write into the profile (not measured)")
    p.add_argument("--tc", type=float, default=0.0001, help="one-way transfer to write into the profile")
    p.add_argument("--name", default=None, help="profile name (default: derived from the device and models)")
    p.add_argument("--out", type=Path, required=True, help="write the profile JSON here")
    p.set_defaults(_bench=run_measure_gpu_command)


def run_measure_gpu_command(args: argparse.Namespace) -> int:
    from starsd.bench.measure_gpu import measure, to_profile

    if min(args.gamma, args.context, args.repeats) < 1 or 1 not in args.batches:
        print("starsd bench measure-gpu: --gamma, --context, --repeats >= 1; --batches must hold 1", file=sys.stderr)
        return 2
    args.batches = sorted(set(args.batches))
    m = measure(args)
    profile = to_profile(args, m)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=2))
    raw = ", ".join(f"{b}:{t * 1e3:.3f}" for b, t in m["raw_draft_curve"])
    print(
        f"{profile['name']}: Tq(B) ms {raw}; Tp({args.gamma}) {m['tp'] * 1e3:.3f} ms; "
        f"Tp1 {m['tp1'] * 1e3:.3f} ms -> {args.out}"
    )
    return 0
