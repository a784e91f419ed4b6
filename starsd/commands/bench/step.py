"""``starsd bench step``: one target step and one draft step, timed per batch size, gamma, context and slot order
(see :mod:`starsd.bench.step`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starsd.commands._common import counts, from_flags, names_among
from starsd.commands.bench.common import add_model_args, error, model_error, stderr_line

HELP = "time one target step and one draft step of StarSD's runners per B, gamma, context and slot order"
DESCRIPTION = (
    "Times TargetRunner.step (B rows verifying gamma drafts each) and DraftRunner.propose_batch "
    "(B sessions, gamma greedy tokens each) on Llama-shaped random-weight models or checkpoints, on any "
    "device: wall time with the device synchronised, CUDA-event time on CUDA, and the host synchronisations "
    "of one step (torch's sync debug mode on CUDA, a counter of would-be syncs on a CPU). Progress goes to "
    "stderr, the table to stdout, the results to --json after every configuration."
)


def configure(parser: argparse.ArgumentParser) -> None:
    from starsd.bench.step import MODES, ROLES, SLOTS

    add_model_args(parser)
    parser.add_argument("--roles", type=names_among(ROLES), default=",".join(ROLES), help="which steps to time")
    parser.add_argument("--batches", type=counts, default="1,4,16,32,64", help="rows (sessions) per step")
    parser.add_argument("--gammas", type=counts, default="2,4,8", help="drafts per row")
    parser.add_argument("--contexts", type=counts, default="128,1024", help="cached tokens per session at the start")
    slots, modes = ",".join(SLOTS), ",".join(MODES)
    parser.add_argument(
        "--slots", type=names_among(SLOTS), default=slots, help="rows in slot order, or a random subset"
    )
    parser.add_argument(
        "--modes", type=names_among(MODES), default=modes, help="eager, and CUDA graphs where the runners have them"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per configuration")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per configuration (medians)")
    parser.add_argument("--budget", type=float, help="seconds; configurations not started by then are skipped")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results here (after every configuration)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    from starsd.bench.step import StepPlan, run_step_bench, write_report
    from starsd.checkpoints import ModelLoadError

    if (problem := model_error(args)) is not None:
        return error(problem, "step")
    sizes = {name: tuple(sorted(set(getattr(args, name)))) for name in ("batches", "gammas", "contexts")}
    plan = from_flags(StepPlan, args, **sizes)
    try:
        plan.check()
        report = run_step_bench(plan, (lambda _: None) if args.quiet else stderr_line, write_report(args.json))
    except (ValueError, ModelLoadError) as exc:
        return error(str(exc), "step")
    print(report.table())
    if args.json:
        print(f"-> {args.json}", file=sys.stderr)
    return 0
