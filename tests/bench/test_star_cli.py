"""`starsd bench star` end to end: the real draft server (emulated service time), emulated targets, JSON
and PNG out. Short points: this pins the plumbing and the report's shape, not performance (that is what the
benchmark itself is for)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starsd import system_model
from starsd.bench import profiles
from starsd.bench.star import StarConfig
from starsd.cli import main

REQUIRED = ("n", "throughput", "model_throughput", "utilization", "idle_fraction", "latency_p50", "latency_p99")


def test_star_sweep_writes_json_and_a_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "star.json", tmp_path / "star.png"
    code = main(
        [
            "bench",
            "star",
            "--n",
            "2,3",
            "--duration",
            "0.6",
            "--warmup",
            "0.2",
            "--draft-service-time",
            "0.002",
            "--tp",
            "0.004",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--quiet",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(out.read_text())
    results = report["results"]
    assert [r["n"] for r in results] == [1, 2, 3]  # N=1 is always measured: the pairs baseline
    for r in results:
        for key in REQUIRED:
            assert isinstance(r[key], int | float), key
        assert r["throughput"] > 0 and r["rounds"] > 0
        assert r["errors"] == []
        assert 0.0 <= r["utilization"] <= 1.0
        assert r["load"]["targets"] >= 1  # /v1/load was read at the end of the window
        assert r["pairs_throughput"] == pytest.approx(r["n"] * results[0]["throughput"])
    mi = report["model_inputs"]
    assert mi["tq"] == 0.002 and mi["tp"] == 0.004 and mi["tq_source"] == "emulated service time"
    assert report["summary"]["optimal_targets"] == 4  # ceil(1 + (0.004 + 0.0002)/0.002)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio" in printed and "goals:" in printed


def test_profiles_listing_names_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "profiles"]) == 0
    text = capsys.readouterr().out
    for name in profiles.names():
        assert name in text
    assert main(["bench", "profiles", "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)] == profiles.names()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "nope"], "known profiles"),
        (["--draft-service-time", "0.004", "--draft-model", "/x"], "not both"),
        (["--duration", "0"], "--duration"),
        (["--max-batch", "4", "--profile", "tpuv4-chinchilla70b-4b"], "batch curve"),
        (["--alpha", "2"], "alpha"),
        (["--draft-load-url", "http://x/v1/load"], "--draft-address"),
    ],
)
def test_bad_flags_fail_fast_with_a_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "star", *args]) == 2
    assert message in capsys.readouterr().err


def test_bench_without_a_benchmark_says_what_to_choose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "star" in capsys.readouterr().err


def _config(*flags: str) -> tuple[StarConfig, list[str]]:
    from starsd.cli import build_parser
    from starsd.commands.bench import build_config

    argv = ["bench", "star", *flags]
    return build_config(build_parser(argv).parse_args(argv))


def test_batching_run_passes_the_curve_to_the_draft_and_uses_the_batched_n_star() -> None:
    cfg, extra = _config("--profile", "h100-llama3.1-70b-tp4_llama3.2-1b", "--max-batch", "8")
    curve = cfg.profile.curve()
    assert curve is not None
    assert extra[extra.index("--max-batch") + 1] == "8"
    assert extra[extra.index("--batch-curve") + 1].startswith("1:")
    inputs = cfg.model_inputs()
    assert inputs.optimal_targets() > 5 * profiles_n_star("h100-llama3.1-70b-tp4_llama3.2-1b")
    assert inputs.optimal_targets() in cfg.ns  # the default sweep measures the (batched) N*


def test_overriding_the_service_time_drops_a_curve_that_belonged_to_the_old_one() -> None:
    cfg, extra = _config("--profile", "h100-llama3.1-70b-tp4_llama3.2-1b", "--draft-service-time", "0.004")
    assert cfg.profile.tq == 0.004 and cfg.profile.batch_curve == ()
    assert cfg.draft_service_time == 0.004 and "--batch-curve" not in extra
    assert cfg.model_inputs().optimal_targets() == 5  # ceil(1 + (15.38 + 0.2) / 4)
    assert 5 in cfg.ns  # the default sweep measures N*


def profiles_n_star(name: str) -> int:

    p = profiles.get(name)
    return system_model.optimal_targets(p.tq, p.tp, p.tc)
