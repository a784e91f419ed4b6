"""The accelerator-profile measurement script runs end to end on a CPU with tiny shapes and writes a
profile that the rest of StarSD loads (the real run needs a GPU: see the module's docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest

from starsd import system_model
from starsd.bench import profiles
from starsd.cli import main


def test_tiny_cpu_run_writes_a_loadable_measured_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "p.json"
    args = [
        "bench",
        "measure-gpu",
        "--draft",
        "tiny",
        "--target",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--context",
        "8",
        "--batches",
        "1,2,4",
        "--repeats",
        "2",
        "--gamma",
        "3",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    p = profiles.load_profile_json(out)
    assert p.kind == "measured" and p.gamma == 3
    curve = p.curve()
    assert curve is not None and [b for b, _ in curve.points] == [1, 2, 4]
    assert p.tq == curve.tq(1) and p.tp > 0 and p.tp1 > 0
    assert system_model.optimal_targets(p.tq, p.tp, p.tc) >= 1
    assert "Tq(B)" in capsys.readouterr().out


def test_batches_must_include_one(tmp_path: Path) -> None:
    assert main(["bench", "measure-gpu", "--batches", "2,4", "--device", "cpu", "--out", str(tmp_path / "x.json")]) == 2
