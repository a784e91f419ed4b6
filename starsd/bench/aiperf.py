"""AIPerf (NVIDIA's vLLM-style benchmark client) as the load of ``starsd bench serve --client aiperf``.

AIPerf is installed apart from the project, in ``.venv-aiperf/`` from ``bench/aiperf.lock`` (``make bench-aiperf``
does it). A pass runs ``aiperf profile`` with the pass's :class:`~starsd.bench.serve.ServeConfig` (synthetic
prompts of ``prompt_tokens`` tokens, ``max_tokens`` out with EOS ignored, streamed, round-robin over the URLs),
keeps AIPerf's own artifacts, and reads its report into the :class:`~starsd.bench.serve.ServeResult` the built-in
client produces, so both print and write alike. AIPerf's "inter-token latency" is per token after the first,
which ``bench serve`` calls TPOT; its "inter-chunk latency" is ``bench serve``'s ITL.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from starsd.bench.serve import Percentiles, ServeConfig, ServeResult

REPORT = "profile_export_aiperf.json"  # AIPerf's whole-run report, at the top of its artifact directory


def aiperf_command(aiperf: str, config: ServeConfig, tokenizer: Path, out: Path) -> list[str]:
    """The ``aiperf profile`` command line of one pass."""
    if config.model is None:
        raise ValueError("AIPerf needs the served model's name")
    flags: list[tuple[str, object]] = [("--url", url) for url in config.urls]
    flags += [
        ("--model", config.model),
        ("--endpoint-type", "completions"),
        ("--tokenizer", tokenizer),
        ("--concurrency", config.concurrency),
        ("--request-count", config.requests),
        ("--warmup-request-count", max(config.warmup, config.concurrency)),
        ("--isl", config.prompt_tokens),
        ("--isl-stddev", 0),
        ("--prompt-output-tokens-mean", config.max_tokens),
        ("--prompt-output-tokens-stddev", 0),
        ("--extra-inputs", f"temperature:{config.temperature}"),
        ("--random-seed", config.seed),
        ("--ui-type", "none"),
        ("--output-artifact-dir", out),
    ]
    if config.ignore_eos:
        flags.append(("--extra-inputs", "ignore_eos:true"))
    return [aiperf, "profile", "--streaming", *(str(part) for pair in flags for part in pair)]


def result_from_report(config: ServeConfig, report: dict[str, Any]) -> ServeResult:
    """AIPerf's report of one pass as a :class:`ServeResult` (its latencies are in ms, ours in seconds)."""

    def value(tag: str) -> float:
        return float((report.get(tag) or {}).get("avg", 0.0))

    def latency(tag: str) -> Percentiles:
        metric = report.get(tag) or {}
        return Percentiles(*(float(metric.get(k, 0.0)) / 1e3 for k in ("avg", "p50", "p90", "p99")))

    return ServeResult(
        config=config,
        completed=int(value("request_count")),  # AIPerf counts the valid requests here, the failed apart
        failed=int(value("error_request_count")),
        errors=[json.dumps(e)[:200] for e in report.get("error_summary") or []][:5],
        duration_s=value("benchmark_duration"),
        request_throughput=value("request_throughput"),
        output_tokens=int(value("total_output_tokens")),
        output_throughput=value("output_token_throughput"),
        total_token_throughput=value("total_token_throughput"),
        ttft_s=latency("time_to_first_token"),
        tpot_s=latency("inter_token_latency"),
        itl_s=latency("inter_chunk_latency"),
        e2e_latency_s=latency("request_latency"),
        acceptance=None,
    )


def run_pass(aiperf: str, config: ServeConfig, tokenizer: Path, out: Path) -> ServeResult:
    """One pass of AIPerf; its artifacts (logs, per-request records, its report) stay under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        with (out / "console.log").open("w") as console:  # AIPerf's own tables: our summary is printed instead
            done = subprocess.run(aiperf_command(aiperf, config, tokenizer, out), stdout=console, stderr=console)
    except OSError as exc:
        raise RuntimeError(
            f"cannot run {aiperf} ({exc}); `make bench-aiperf` installs AIPerf in .venv-aiperf/"
        ) from None
    report = out / REPORT
    if done.returncode != 0 or not report.is_file():
        raise RuntimeError(f"aiperf failed (exit {done.returncode}): see {out / 'console.log'}")
    return result_from_report(config, json.loads(report.read_text()))
