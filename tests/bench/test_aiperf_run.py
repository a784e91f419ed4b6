"""The AIPerf sweep of `make bench`: its command line and the figures kept from AIPerf's report (a real one,
from AIPerf 0.13.0 against a local star, trimmed to the metrics the summary reads)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from starsd.bench.aiperf_run import SUMMARY_METRICS, aiperf_command, summarize

REPORT = Path(__file__).parent / "aiperf_report.json"


def test_the_summary_keeps_each_metrics_unit_mean_and_percentiles() -> None:
    report = json.loads(REPORT.read_text())
    summary = summarize(report)
    assert set(summary) == set(SUMMARY_METRICS)
    assert summary["time_to_first_token"]["unit"] == "ms"
    assert summary["time_to_first_token"]["p50"] == report["time_to_first_token"]["p50"]
    assert summary["output_token_throughput"] == {"unit": "tokens/sec", "avg": report["output_token_throughput"]["avg"]}
    assert summary["output_sequence_length"]["avg"] == 16.0


def test_a_pass_sends_fixed_length_streamed_completions_that_ignore_eos() -> None:
    args = argparse.Namespace(requests=4, prompt_tokens=64, max_tokens=32, temperature=0.0, seed=3)
    command = aiperf_command("aiperf", "http://h:1", "target", Path("models/target"), 8, args, Path("out"))
    assert command[:2] == ["aiperf", "profile"] and "--streaming" in command
    assert command[command.index("--endpoint-type") + 1] == "completions"
    assert command[command.index("--request-count") + 1] == "16"  # at least 2 x concurrency
    assert command[command.index("--isl-stddev") + 1] == "0"
    extra = [command[i + 1] for i, flag in enumerate(command) if flag == "--extra-inputs"]
    assert extra == ["ignore_eos:true", "temperature:0.0"]
