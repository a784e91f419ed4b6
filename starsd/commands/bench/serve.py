"""``starsd bench serve``: load an OpenAI-compatible endpoint (ours, vLLM's, any) and report serving figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from starsd.commands._common import positive_ints

HELP = "drive an OpenAI-compatible endpoint at fixed concurrency: tokens/s, TTFT, TPOT, ITL, E2E"
DESCRIPTION = (
    "Sends streamed completions of random token prompts at a fixed concurrency to --url (any "
    "OpenAI-compatible server), or to a star it starts here (--local-targets), and reports output "
    "tokens/s, TTFT, TPOT, ITL and end-to-end latency percentiles. --concurrency 1,16 runs one pass each."
)


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("the endpoint (one of)")
    where.add_argument("--url", action="append", default=[], help="base URL, e.g. http://127.0.0.1:8000 (repeatable)")
    where.add_argument(
        "--local-targets", type=int, metavar="N", help="start 1 draft and N targets here on the shipped models"
    )
    where.add_argument("--no-draft", action="store_true", help="with --local-targets: the targets decode alone")
    where.add_argument("--target-arg", action="append", default=[], help="extra `starsd target` flag (repeatable)")
    load = parser.add_argument_group("the load")
    load.add_argument(
        "--concurrency", type=positive_ints, default=(16,), help="requests in flight, e.g. 1,16 (default 16)"
    )
    load.add_argument("--requests", type=int, default=None, help="requests per pass (default: 4 x concurrency, >= 16)")
    load.add_argument("--prompt-tokens", type=int, default=32, help="random prompt length in tokens (default 32)")
    load.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    load.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    load.add_argument("--model", help="the model name to send (default: none, the server's own)")
    load.add_argument(
        "--no-ignore-eos", action="store_true", help="let requests stop at EOS (default: always max_tokens)"
    )
    load.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")
    client = parser.add_argument_group("the client")
    client.add_argument(
        "--client",
        choices=("builtin", "aiperf"),
        default="builtin",
        help="builtin (this package's) or AIPerf, NVIDIA's vLLM-style client (`make bench-aiperf` installs it)",
    )
    client.add_argument("--aiperf", default=".venv-aiperf/bin/aiperf", help="the aiperf executable")
    client.add_argument(
        "--tokenizer", type=Path, help="AIPerf: the served model's tokenizer (default: the shipped target's)"
    )
    client.add_argument("--aiperf-out", type=Path, default=Path("bench/results/aiperf"), help="AIPerf's artifacts")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every pass's figures as JSON")


def run(args: argparse.Namespace) -> int:
    from starsd.bench import aiperf
    from starsd.bench.report import to_json
    from starsd.bench.serve import ServeConfig, ServeReport, ServeResult, run
    from starsd.local import default_models_dir

    if bool(args.url) == (args.local_targets is not None):
        print("starsd bench serve: give --url URL or --local-targets N", file=sys.stderr)
        return 2
    star = None
    urls = list(args.url)
    if args.local_targets is not None:
        from starsd.local import LocalStar, StartError

        star = LocalStar(targets=args.local_targets, target_args=list(args.target_arg))
        targets = "1 target" if args.local_targets == 1 else f"{args.local_targets} targets"
        print(f"starting 1 draft and {targets} (logs in {star.log_dir}) ...", file=sys.stderr)
        try:
            star.start()
        except StartError as exc:
            print(f"starsd bench serve: {exc}", file=sys.stderr)
            return 1
        if args.no_draft:
            star.kill_draft()
        urls = star.urls
    passes: list[ServeResult] = []
    try:
        model = args.model or (_served_model(urls[0]) if args.client == "aiperf" else None)
        for concurrency in args.concurrency:
            config = ServeConfig(
                urls=tuple(u.rstrip("/") for u in urls),
                concurrency=concurrency,
                requests=args.requests or max(16, 4 * concurrency),
                prompt_tokens=args.prompt_tokens,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                ignore_eos=not args.no_ignore_eos,
                seed=args.seed,
                model=model,
            )
            print(f"concurrency {concurrency}: {config.requests} requests ...", file=sys.stderr, flush=True)
            if args.client == "aiperf":
                tokenizer = args.tokenizer or default_models_dir() / "target"
                result = aiperf.run_pass(args.aiperf, config, tokenizer, args.aiperf_out / f"concurrency-{concurrency}")
            else:
                result = run(config)
            passes.append(result)
            print(result.table(), flush=True)
    except (RuntimeError, ValueError) as exc:
        print(f"starsd bench serve: {exc}", file=sys.stderr)
        return 1
    finally:
        if star is not None:
            star.stop()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(ServeReport(args.client, passes)), indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(p.failed == 0 for p in passes) else 1


def _served_model(url: str) -> str:
    """The first model ``url``'s /v1/models lists (AIPerf must name one)."""
    from starsd.local import http_json

    try:
        status, models = http_json(f"{url}/v1/models", timeout=10.0)
    except OSError as exc:
        raise RuntimeError(f"cannot read {url}/v1/models ({exc}): give --model") from None
    if status != 200 or not isinstance(models, dict) or not models.get("data"):
        raise RuntimeError(f"{url}/v1/models answered {status}: give --model")
    return str(models["data"][0]["id"])
