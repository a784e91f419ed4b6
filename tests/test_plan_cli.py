"""`starsd plan`: the system model's table over N, through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from starsd import system_model
from starsd.bench import profiles
from starsd.cli import main

BASE = ["plan", "--tq", "0.004", "--tp", "0.02", "--tc", "0.001", "--gamma", "4", "--alpha", "0.8"]


def run_plan(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main([*BASE[:1], *extra]) if extra and extra[0] == "--raw" else main([*BASE, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_marks_n_star_and_shows_both_regimes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys)
    assert code == 0
    marked = [line for line in out.splitlines() if "<- N*" in line]
    assert len(marked) == 1
    assert marked[0].split()[0] == "7"  # ceil(1 + 0.022/0.004)
    assert "FullyLoaded" in marked[0]
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(1, 15))
    assert rows[5][1] == "UnderLoaded" and rows[6][1] == "FullyLoaded"
    assert "N* = 7" in out


def test_json_output_matches_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--json", "--n", "1,7,32")
    assert code == 0
    report = json.loads(out)
    assert report["optimal_targets"] == 7
    assert [r["n"] for r in report["rows"]] == [1, 7, 32]
    for row in report["rows"]:
        assert row["throughput"] == pytest.approx(system_model.throughput(row["n"], 0.004, 0.02, 0.001, 4, alpha=0.8))
        assert row["regime"] in ("UnderLoaded", "FullyLoaded")
    assert report["rows"][1]["optimal"] is True


def test_betas_instead_of_alpha(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--tq", "0.004", "--tp", "0.02", "--tc", "0", "--gamma", "2", "--betas", "0.9,0.5", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["expected_tokens_per_round"] == pytest.approx(1 + 0.9 + 0.45)


def test_batch_curve_raises_n_star_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--batch-curve", "8:0.006")  # B=1 comes from --tq
    assert code == 0
    assert "grows slowly with B" in out
    marked = [line for line in out.splitlines() if "<- N*" in line]
    assert marked and int(marked[0].split()[0]) == system_model.batched_optimal_targets(
        system_model.BatchCurve(((1, 0.004), (8, 0.006))), 0.02, 0.001
    )


def test_profile_supplies_the_times_and_flags_override_them(capsys: pytest.CaptureFixture[str]) -> None:
    p = profiles.get(profiles.DEFAULT_PROFILE)
    assert main(["plan", "--profile", p.name, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"]["tq"] == p.tq and report["inputs"]["alpha"] == p.alpha
    assert report["optimal_targets"] == system_model.optimal_targets(p.tq, p.tp, p.tc)
    assert main(["plan", "--profile", p.name, "--tq", "0.001", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"]["tq"] == 0.001 and report["inputs"]["tp"] == p.tp


def test_profile_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "gamma": 3, "tq": 0.002, "tp": 0.01, "tc": 0.0, "alpha": 0.6}))
    assert main(["plan", "--profile-json", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimal_targets"] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--tq", "0.004", "--tp", "0.02", "--tc", "0.001", "--gamma", "4"], "--alpha or --betas"),
        (["plan", "--tp", "0.02", "--tc", "0.001", "--gamma", "4", "--alpha", "0.5"], "--tq"),
        ([*BASE, "--alpha", "1.5"], "alpha"),
        ([*BASE[:-2], "--alpha", "0.5", "--tq", "0"], "tq"),
        ([*BASE, "--batch-curve", "1:0.005,8:0.006"], "Tq\\(1\\)"),
        ([*BASE, "--batch-curve", "nonsense"], "B:SECONDS"),
        ([*BASE, "--max-n", "0"], "--max-n"),
        (["plan", "--profile", "no-such-profile"], "known profiles"),
    ],
)
def test_bad_input_is_a_clear_error_not_a_traceback(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "starsd plan:" in err
    assert pytest.importorskip("re").search(message, err)


def test_default_rows_stay_short_for_a_large_batched_n_star() -> None:
    from starsd.commands.plan import default_ns

    assert default_ns(7) == list(range(1, 15))
    ns = default_ns(113)
    assert len(ns) < 20
    assert {1, 2, 64, 112, 113, 114, 226} <= set(ns)


def test_plan_does_not_import_torch_or_grpc() -> None:
    code = (
        "import sys\n"
        "from starsd.cli import main\n"
        "main(['plan', '--profile', 'tpuv4-chinchilla70b-4b'])\n"
        "bad = [m for m in ('torch', 'grpc', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "<- N*" in result.stdout
