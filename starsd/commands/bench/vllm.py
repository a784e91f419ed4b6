"""``starsd bench vllm``: vLLM replicas with a StarSD draft against vLLM alone and with its in-process draft,
one replica and two, loaded by vLLM's own client in one run (:mod:`starsd.bench.vllm_compare`)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from starsd.commands._common import names_among, positive_ints
from starsd.commands.bench.common import error, measure_and_publish, stderr_line

HELP = "vLLM + a StarSD draft vs vLLM alone and with its own draft; 2 replicas sharing 1 draft vs 2 drafts"
DESCRIPTION = (
    "Starts vLLM's CPU build (from --vllm-venv; `make test-vllm` installs it) on --target in the setups named by "
    "--setups, all at once, plus one StarSD draft on --draft, and loads each setup with `vllm bench serve` "
    "(random prompts, greedy, --ignore-eos) at each --concurrency (per replica; a pair gets one client per "
    "replica). Reports output tokens/s, TPOT, vLLM's acceptance, and the ratios the vLLM integration is judged "
    "by. Takes several minutes: the servers start together, 2-3 minutes each on two cores."
)


def configure(parser: argparse.ArgumentParser) -> None:
    from starsd.bench.vllm_compare import SETUPS
    from starsd.bench.vllm_fleet import DEFAULT_VENV

    parser.add_argument("--target", type=Path, default=Path("models/target"), help="target checkpoint for vLLM")
    parser.add_argument("--draft", type=Path, default=Path("models/draft"), help="draft checkpoint (both drafts)")
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_VENV, help=f"vLLM's venv (default {DEFAULT_VENV})")
    parser.add_argument(
        "--setups",
        type=names_among(SETUPS, f"setups among {', '.join(SETUPS)}"),
        default=SETUPS,
        help=f"comma-separated, of {','.join(SETUPS)} (default: all)",
    )
    parser.add_argument("--concurrency", type=positive_ints, default=(1, 16), help="per replica (default 1,16)")
    parser.add_argument("--requests", type=int, default=64, help="requests per client pass (default 64)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="random prompt length (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    parser.add_argument("--gamma", type=int, default=4, help="num_speculative_tokens of every draft (default 4)")
    parser.add_argument(
        "--draft-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more `starsd draft` option for the StarSD draft, e.g. --draft-arg=--draft-ahead=on (repeatable)",
    )
    parser.add_argument(
        "--draft-variants",
        metavar="OPTIONS;OPTIONS[;...]",
        help="an interleaved A/B of `starsd draft` options, e.g. --draft-variants='--max-batch=8;--max-batch=32' "
        "(with '=', as the value starts with '--'): one replica of draft-model and one of starsd start once, and "
        "each round restarts the StarSD draft with each variant in turn, measuring the in-process draft right "
        "before each StarSD pass (this machine drifts between minutes; both sides of a ratio see the same "
        "minute); reports each variant's median ratio (replaces --setups; --draft-arg options apply to all)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --draft-variants: rounds (default 3)")
    parser.add_argument("--start-timeout", type=float, default=1200.0, help="seconds for all servers to start")
    parser.add_argument("--log-dir", type=Path, help="servers' and clients' logs (default: a temporary folder)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")


def _variant_error(variant: str) -> str | None:
    """Why ``variant`` is not a set of `starsd draft` options (checked before anything starts), or None."""
    import shlex

    from starsd.cli import build_parser

    try:
        words = shlex.split(variant)
    except ValueError as exc:
        return f"--draft-variants {variant!r}: {exc}"
    argv = ["draft", "--model", "m", *words]
    try:
        build_parser(argv).parse_args(argv)
    except SystemExit:
        return f"--draft-variants {variant!r}: not options of `starsd draft` (see the message above)"
    return None


def run(args: argparse.Namespace) -> int:
    from starsd.bench.report import Machine
    from starsd.bench.vllm_compare import VllmCompareConfig, VllmCompareReport, VllmPoint, measure

    if args.requests < 1 or args.prompt_tokens < 1 or args.max_tokens < 1 or args.gamma < 1 or args.rounds < 1:
        return error("--requests, --prompt-tokens, --max-tokens, --gamma and --rounds must be >= 1", "vllm")
    variants = tuple(v.strip() for v in (args.draft_variants or "").split(";") if v.strip())
    if args.draft_variants is not None and len(variants) < 2:
        return error(
            f"--draft-variants needs two or more variants separated by ';', got {args.draft_variants!r}", "vllm"
        )
    for variant in variants:
        if (problem := _variant_error(variant)) is not None:
            return error(problem, "vllm")
    vllm = args.vllm_venv / "bin" / "vllm"
    if not vllm.is_file():
        return error(f"no vLLM at {vllm}: `make test-vllm` installs vLLM's CPU build there (docs/vllm.md)", "vllm")
    for flag, path in (("--target", args.target), ("--draft", args.draft)):
        if not (path / "config.json").is_file():
            return error(f"{flag} {path} holds no checkpoint (no config.json)", "vllm")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="starsd-bench-vllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_line(f"logs of every server and client pass: {log_dir}")
    config = VllmCompareConfig(
        target=args.target.resolve(),
        draft=args.draft.resolve(),
        venv=args.vllm_venv.resolve(),
        concurrency=tuple(args.concurrency),
        requests=args.requests,
        input_len=args.prompt_tokens,
        output_len=args.max_tokens,
        gamma=args.gamma,
        start_seconds=args.start_timeout,
        log_dir=log_dir.resolve(),
        draft_args=tuple(args.draft_arg),
        variants=variants,
        rounds=args.rounds if variants else 1,
    )

    def report(points: list[VllmPoint], machine: Machine) -> VllmCompareReport:
        return VllmCompareReport(config, machine, points)

    return measure_and_publish("vllm", lambda: measure(config, args.setups, stderr_line), report, args.json)
