"""The GPU check's CPU path: ``bench/gpu/run.sh`` runs every stage with tiny models and leaves each stage's JSON,
a measured profile StarSD loads, and the goals' verdicts, so that the script the GPU run uses cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from starsd.bench import profiles
from starsd.bench.gpu_check import STAGES, device_figures

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "GPU_CHECK_SMALL": "1",
        "GPU_CHECK_TOTAL": "3000",
        "GPU_CHECK_LIMIT_SCALE": "5",  # a shared CPU is slow; the limits themselves are the GPU run's
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/gpu/run.sh")], env=env, capture_output=True, text=True, timeout=3000
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _json(out: Path, name: str) -> dict:  # type: ignore[type-arg]
    return dict(json.loads((out / f"{name}.json").read_text()))


def test_every_stage_ran_to_its_end_and_wrote_its_json(results: Path) -> None:
    stages = json.loads((results / "stages.json").read_text())
    assert [s["stage"] for s in stages] == list(STAGES)
    assert all(s["exit_status"] == 0 for s in stages), stages
    for name in (*STAGES, "summary"):
        assert (results / f"{name}.json").is_file(), name


def test_preflight_reports_versions_imports_and_copy_bandwidth(results: Path) -> None:
    pre = _json(results, "preflight")
    assert pre["imports_ok"], pre["imports"]
    assert pre["versions"]["torch"] and pre["versions"]["grpcio"] != "missing"
    assert pre["copy"]["read_write_bytes_per_s"] > 0 and pre["copy"]["ms_per_gib"] > 0


def test_correctness_ran_the_cuda_variants_and_the_probes(results: Path) -> None:
    corr = _json(results, "correctness")
    cases = corr["cuda_tests"]["cases"]
    assert any("test_lossless_on_device" in c["test"] for c in cases)
    assert any("test_on_cuda_batched_greedy" in c["test"] for c in cases)
    for replay in ("test_replayed_drafting_equals_eager_drafting_on_cuda", "test_replayed_verification_equals"):
        assert sum(replay in c["test"] for c in cases) >= 2, replay  # fp32 and bf16 (on each test pair)
    assert all(c["outcome"] == "skipped" for c in cases)  # no GPU here: each says why
    fp32 = corr["greedy_float32"]
    assert fp32["identical_outputs"] == fp32["prompts"] and fp32["match_rate"] == 1.0
    assert corr["greedy_bfloat16"]["prompts"] == fp32["prompts"]
    assert 0 <= corr["self_draft_bfloat16"]["rejection_rate"] <= 1 and corr["self_draft_float32"]["drafted"] > 0
    assert corr["passed"] is True


def test_the_step_table_covers_both_roles(results: Path) -> None:
    step = _json(results, "step")
    assert step["complete"] and step["sync_method"] == "torch-dispatch-counter"
    roles = {(r["role"], r["gamma"], r["batch"]) for r in step["rows"]}
    assert {("target", 4, 1), ("draft", 4, 1), ("draft", 4, 4), ("target", 2, 4)} <= roles
    assert all(r["wall_ms"] > 0 and r["syncs"] >= 1 and r["ops"] > 0 for r in step["rows"])


def test_the_star_compares_one_two_and_four_targets_with_the_model(results: Path) -> None:
    star = _json(results, "star")
    points = star["points"]
    assert [p["targets"] for p in points] == [1, 2, 4]
    for p in points:
        assert p["tokens_per_s"] > 0 and p["alone_tokens_per_s"] > 0 and p["predicted_tokens_per_s"] > 0
        assert p["prediction_from"].startswith("bench step")  # the step stage's Tq(B), Tp feed the model
        assert 0 < p["mean_accepted"] <= star["gamma"]


def test_the_local_smoke_matches_the_target_alone(results: Path) -> None:
    smoke = _json(results, "smoke")
    assert smoke["completions"] == 16 and smoke["identical"] == 16 and smoke["passed"]
    assert smoke["drafted_tokens"] > 0 and smoke["fallback_tokens"] == 0


def test_the_profile_stage_writes_a_profile_starsd_loads_and_the_goals(results: Path) -> None:
    p = profiles.load_profile_json(results / "profile.json")
    assert p.kind == "measured" and "bench/gpu/run.sh" in p.source and p.curve() is not None
    assert p.tp1 == pytest.approx(_json(results, "star")["points"][0]["tp1_ms"] / 1e3)
    summary = _json(results, "summary")
    assert summary["profile"] == p.name and summary["correctness_passed"] and summary["smoke_passed"]
    goals = summary["step_goals"]["eager"]
    assert goals["tq_ms"] == pytest.approx(p.tq * 1e3) and goals["n_star"] >= 1
    assert goals["tp_ops"] > 0 and goals["tq_ops"] > 0 and "tp_device_idle_share" not in goals  # no CUDA here
    assert {"speedup", "measured_over_model", "within_10_percent_of_model"} <= set(summary["star_4"])


def test_device_figures_say_how_much_of_a_step_the_device_waited_for_the_host() -> None:
    def row(role: str, mode: str, batch: int, cuda: float, kernel: float, captures: int | None) -> dict:  # type: ignore[type-arg]
        return {
            "role": role,
            "mode": mode,
            "gamma": 4,
            "batch": batch,
            "slots": "consecutive",
            "cuda_ms": cuda,
            "kernel_ms": kernel,
            "ops": 900 if mode == "eager" else 12,
            "captures": captures,
        }

    step = {
        "rows": [
            row("target", "eager", 1, 60.0, 6.0, None),
            row("draft", "eager", 1, 40.0, 30.0, None),
            row("target", "graphs", 1, 8.0, 6.0, 0),
            row("target", "graphs", 4, 9.0, 7.0, 2),
            row("draft", "graphs", 1, 4.0, 3.0, 1),
        ]
    }
    eager = device_figures(step, "eager")
    assert eager == {
        "tp_ops": 900,
        "tp_kernel_ms": 6.0,
        "tp_device_idle_share": 0.9,
        "tq_ops": 900,
        "tq_kernel_ms": 30.0,
        "tq_device_idle_share": 0.25,
    }
    graphs = device_figures(step, "graphs")
    assert graphs["tp_device_idle_share"] == 0.25 and graphs["tp_ops"] == 12 and graphs["captures_while_timed"] == 3
