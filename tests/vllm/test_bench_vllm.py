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
