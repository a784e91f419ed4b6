"""AIPerf as the load of `starsd bench serve --client aiperf`: its command line, its report read into the same
ServeResult as the built-in client's (a real report, AIPerf 0.13.0 against a local star at concurrency 4, trimmed
to the metrics read), and a clear error when AIPerf cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starsd.bench.aiperf import aiperf_command, result_from_report
from starsd.bench.serve import ServeConfig
from starsd.cli import main

REPORT = json.loads((Path(__file__).parent / "aiperf_report.json").read_text())
CONFIG = ServeConfig(urls=("http://a:1", "http://b:2"), concurrency=4, requests=16, max_tokens=16, model="target")


def test_a_pass_sends_the_configured_streamed_completions_round_robin() -> None:
    command = aiperf_command("aiperf", CONFIG, Path("models/target"), Path("out"))
    assert command[:3] == ["aiperf", "profile", "--streaming"]

    def values(flag: str) -> list[str]:
        return [command[i + 1] for i, part in enumerate(command) if part == flag]

    assert values("--url") == ["http://a:1", "http://b:2"] and values("--model") == ["target"]
    assert values("--endpoint-type") == ["completions"] and values("--request-count") == ["16"]
    assert values("--isl") == ["32"] and values("--prompt-output-tokens-mean") == ["16"]
    assert values("--extra-inputs") == ["temperature:0.0", "ignore_eos:true"]
    with pytest.raises(ValueError, match="model"):
        aiperf_command("aiperf", ServeConfig(urls=("http://a:1",)), Path("t"), Path("out"))


def test_the_report_reads_into_the_builtin_clients_result_in_seconds() -> None:
    result = result_from_report(CONFIG, REPORT)
    assert (result.completed, result.failed, result.errors) == (16, 0, [])
    assert result.output_throughput == REPORT["output_token_throughput"]["avg"]
    assert result.output_tokens == 256 and result.duration_s == REPORT["benchmark_duration"]["avg"]
    ttft = REPORT["time_to_first_token"]
    assert result.ttft_s.p50 == pytest.approx(ttft["p50"] / 1e3) and result.ttft_s.p99 == pytest.approx(
        ttft["p99"] / 1e3
    )
    assert result.tpot_s.mean == pytest.approx(REPORT["inter_token_latency"]["avg"] / 1e3)  # AIPerf's ITL is per token
    assert result.itl_s.mean == pytest.approx(REPORT["inter_chunk_latency"]["avg"] / 1e3)  # its chunk gaps are ours
    assert result.acceptance is None and "TTFT" in result.table()


def test_a_missing_aiperf_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "serve", "--client", "aiperf", "--aiperf", str(tmp_path / "none"), "--url", "http://127.0.0.1:9"]
    argv += ["--model", "m", "--tokenizer", str(tmp_path), "--aiperf-out", str(tmp_path / "out"), "--concurrency", "1"]
    assert main(argv) == 1
    assert "make bench-aiperf" in capsys.readouterr().err


def test_without_a_model_name_the_served_one_is_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "serve", "--client", "aiperf", "--url", "http://127.0.0.1:9", "--aiperf-out", str(tmp_path)]
    assert main(argv) == 1
    assert "give --model" in capsys.readouterr().err
