"""`starsd bench vllm` end to end: real `vllm serve` processes (one alone, one with StarSD's proposer beside a
StarSD draft), loaded by vLLM's own client; the JSON has every pass, none failed, and vLLM counted StarSD's
proposals as accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starsd.cli import main
from tests.vllm.conftest import NO_VLLM, START_SECONDS, VENV

pytestmark = [
    pytest.mark.skipif(NO_VLLM is not None, reason=NO_VLLM or ""),
    pytest.mark.timeout(int(START_SECONDS) + 900),
]


def test_bench_vllm_measures_each_setup_with_vllms_client(shipped_pair: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "vllm.json"
    argv = ["bench", "vllm", "--vllm-venv", str(VENV), "--draft", str(shipped_pair[0]), "--target"]
    argv += [str(shipped_pair[1]), "--setups", "alone,starsd", "--concurrency", "2", "--requests", "8"]
    argv += ["--max-tokens", "16", "--start-timeout", str(START_SECONDS), "--log-dir", str(tmp_path / "logs")]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    points = {p["setup"]: p for p in report["points"]}
    assert set(points) == {"alone", "starsd"}
    assert all(p["failed"] == 0 and p["output_throughput"] > 0 and p["concurrency"] == 2 for p in points.values())
    assert points["alone"]["acceptance"] is None
    assert 0 < points["starsd"]["acceptance"] <= 1  # vLLM verified StarSD's proposals and accepted some
    ratio = next(r for r in report["ratios"] if r["name"] == "starsd / alone")
    assert ratio["value"] == pytest.approx(points["starsd"]["output_throughput"] / points["alone"]["output_throughput"])


def test_draft_variants_restart_the_draft_between_interleaved_passes(
    shipped_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two variants of the StarSD draft, one round: the draft restarts with each, the replica's proposer
    reconnects (its proposals are accepted again), and each StarSD pass has its in-process pass beside it."""
    out, logs = tmp_path / "variants.json", tmp_path / "logs"
    argv = ["bench", "vllm", "--vllm-venv", str(VENV), "--draft", str(shipped_pair[0]), "--target"]
    argv += [str(shipped_pair[1]), "--draft-variants=--max-batch=4;--max-batch=8", "--rounds", "1"]
    argv += ["--concurrency", "2", "--requests", "8", "--max-tokens", "16", "--start-timeout", str(START_SECONDS)]
    assert main([*argv, "--log-dir", str(logs), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    points = {(p["setup"], p["variant"]): p for p in report["points"]}
    variants = ["--max-batch=4", "--max-batch=8"]
    assert set(points) == {(s, v) for s in ("draft-model", "starsd") for v in variants}
    assert all(p["failed"] == 0 and p["round"] == 0 and p["concurrency"] == 2 for p in points.values())
    for v in variants:
        assert 0 < points[("starsd", v)]["acceptance"] <= 1  # reached the restarted draft
    draft_log = (logs / "draft" / "draft.log").read_text()
    assert "max batch 4" in draft_log and "max batch 8" in draft_log  # the start-up line of each variant
    ratios = {r["name"]: r for r in report["ratios"]}
    for v in variants:
        ratio = ratios[f"starsd / draft-model [{v}]"]
        own, starsd = points[("draft-model", v)], points[("starsd", v)]
        assert ratio["value"] == pytest.approx(starsd["output_throughput"] / own["output_throughput"])
