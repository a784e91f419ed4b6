"""AIPerf, a vLLM-style benchmark client, against a local star: ``python -m starsd.bench.aiperf_run``.

AIPerf (NVIDIA's successor to genai-perf, from the package index) is installed apart from the project, in
``.venv-aiperf/`` from ``bench/aiperf.lock`` (``make bench`` does it). This starts one draft and the given number
of targets on the shipped models, sweeps AIPerf's streamed completions over the concurrencies, and keeps each
pass's report (AIPerf's own ``profile_export_aiperf.json``, with the servers' vLLM-named metrics it scrapes)
under ``--out``, plus ``summary.json``: output tokens/s and the TTFT / ITL / latency percentiles per pass.
Everything is offline: prompts are synthetic and the tokenizer is the shipped checkpoint's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# AIPerf's metric tags (profile_export_aiperf.json) kept in the summary.
SUMMARY_METRICS = (
    "output_token_throughput",
    "request_throughput",
    "time_to_first_token",
    "inter_token_latency",
    "request_latency",
    "output_sequence_length",
)


def aiperf_command(
    aiperf: str, url: str, model: str, tokenizer: Path, concurrency: int, args: argparse.Namespace, out: Path
) -> list[str]:
    """The ``aiperf profile`` command line of one pass (synthetic prompts of fixed length, fixed output)."""
    flags = [
        ("--model", model),
        ("--url", url),
        ("--endpoint-type", "completions"),
        ("--tokenizer", tokenizer),
        ("--concurrency", concurrency),
        ("--request-count", max(args.requests, 2 * concurrency)),
        ("--warmup-request-count", concurrency),
        ("--isl", args.prompt_tokens),
        ("--isl-stddev", 0),
        ("--prompt-output-tokens-mean", args.max_tokens),
        ("--prompt-output-tokens-stddev", 0),
        ("--extra-inputs", "ignore_eos:true"),
        ("--extra-inputs", f"temperature:{args.temperature}"),
        ("--random-seed", args.seed),
        ("--ui-type", "none"),
        ("--output-artifact-dir", out),
    ]
    return [aiperf, "profile", "--streaming", *(str(part) for pair in flags for part in pair)]


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The figures kept from one pass's AIPerf report: each metric's unit, mean and percentiles."""
    records = report.get("records", report)
    kept: dict[str, Any] = {}
    for tag in SUMMARY_METRICS:
        metric = records.get(tag)
        if isinstance(metric, dict):
            kept[tag] = {k: metric[k] for k in ("unit", "avg", "p50", "p90", "p99") if k in metric}
    return kept


REPORT = "profile_export_aiperf.json"  # AIPerf's whole-run report, at the top of its artifact directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m starsd.bench.aiperf_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiperf", default=".venv-aiperf/bin/aiperf", help="the aiperf executable")
    parser.add_argument("--out", type=Path, default=Path("bench/results/aiperf"), help="where the reports go")
    parser.add_argument("--targets", type=int, default=1, help="targets of the local star (default 1)")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated concurrencies (default 1,8)")
    parser.add_argument("--requests", type=int, default=32, help="requests per pass, at least 2 x concurrency")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="synthetic prompt length (default 64)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="AIPerf's random seed (default 0)")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]

    from starsd.local import LocalStar, StartError, default_models_dir, http_json

    star = LocalStar(targets=args.targets)
    print(f"starting 1 draft and {args.targets} targets (logs in {star.log_dir}) ...", file=sys.stderr)
    try:
        star.start()
    except StartError as exc:
        print(f"the star did not start: {exc}", file=sys.stderr)
        return 1
    summary: list[dict[str, Any]] = []
    try:
        url = star.urls[0]
        status, models = http_json(f"{url}/v1/models")
        if status != 200:
            print(f"{url}/v1/models answered {status}", file=sys.stderr)
            return 1
        model = models["data"][0]["id"]
        for concurrency in concurrencies:
            out = args.out / f"concurrency-{concurrency}"
            command = aiperf_command(args.aiperf, url, model, default_models_dir() / "target", concurrency, args, out)
            print(f"aiperf at concurrency {concurrency} -> {out}", file=sys.stderr)
            done = subprocess.run(command, check=False)
            report = out / REPORT
            if done.returncode != 0 or not report.is_file():
                print(f"aiperf failed at concurrency {concurrency} (exit {done.returncode})", file=sys.stderr)
                return 1
            figures = summarize(json.loads(report.read_text()))
            summary.append({"concurrency": concurrency, "report": str(report), **figures})
    finally:
        star.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for row in summary:
        tps = row.get("output_token_throughput", {}).get("avg")
        ttft = row.get("time_to_first_token", {}).get("p50")
        print(f"concurrency {row['concurrency']}: output tokens/s {tps}, TTFT p50 {ttft} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
