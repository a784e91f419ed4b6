"""`starsd bench star --drafts 2`: the plumbing and the JSON's shape (no figure asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starsd.bench.drafts import assign
from starsd.cli import main


def test_targets_are_spread_over_their_first_choices() -> None:
    chosen = assign([f"t{i}" for i in range(12)], ["a", "b", "c", "d"])
    assert sorted(chosen.count(x) for x in "abcd") == [3, 3, 3, 3]


def test_two_drafts_run_and_write_typed_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "drafts.json"
    code = main(["bench", "star", "--drafts", "2", "--duration", "1", "--warmup", "0.5", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["optimal_targets"] == 3  # the default profile's N*
    assert report["goal"] == 0.9 and isinstance(report["goal_met"], bool)
    [point] = report["points"]
    assert (point["drafts"], point["targets"], point["per_draft"]) == (2, 6, [3, 3])
    assert point["throughput"] > 0 and report["one_draft_throughput"] > 0
    assert point["ratio"] == pytest.approx(point["throughput"] / (2 * report["one_draft_throughput"]))
    assert point["errors"] == []
    assert "/(D x one)" in capsys.readouterr().out


def test_drafts_refuse_a_real_draft(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "star", "--drafts", "2", "--draft-address", "127.0.0.1:1"])
    assert code == 2
    assert "--drafts runs emulated drafts" in capsys.readouterr().err
