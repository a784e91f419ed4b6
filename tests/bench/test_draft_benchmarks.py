"""The pure parts of the capacity, fairness and gamma benchmarks (Jain's index, windows, result shaping) and
one short fairness run end to end (plumbing and JSON shape only: no figure is asserted)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from starsd.bench.emulated import Round, TargetRun
from starsd.bench.fairness import fairness_point, jain_index, per_target_throughput, skewed_targets
from starsd.bench.gamma import GammaPoint, GammaReport, summarise_gamma
from starsd.bench.harness import local_draft, parse_metrics, window_counts
from starsd.bench.report import Machine
from starsd.cli import main


def test_jain_index_bounds_and_known_values() -> None:
    assert jain_index([3.0, 3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([16.0, 1.0, 1.0, 1.0]) == pytest.approx(19**2 / (4 * 259))
    assert jain_index([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError):
        jain_index([])
    with pytest.raises(ValueError):
        jain_index([1.0, -1.0])


def _run(target: str, committed: list[float], tokens: int = 3) -> TargetRun:
    run = TargetRun(target)
    run.rounds = [Round(t - 0.01, t - 0.005, t, tokens, tokens - 1, 0.001) for t in committed]
    return run


def test_window_counts_only_rounds_committed_inside() -> None:
    runs = [_run("a", [0.5, 1.0, 1.5, 2.0]), _run("b", [1.2])]
    assert window_counts(runs, 1.0, 2.0) == (3, 9)


def test_per_target_throughput_sums_the_sessions_of_a_target() -> None:
    runs = [_run("busy", [1.1, 1.2]), _run("busy", [1.3]), _run("small", [1.4])]
    tput = per_target_throughput(runs, 1.0, 2.0)
    assert tput == {"busy": pytest.approx(9.0), "small": pytest.approx(3.0)}
    point = fairness_point("fair", tput)
    assert point.total == pytest.approx(12.0)
    assert point.jain == pytest.approx(jain_index([9.0, 3.0]))  # per target, not per session (that is 1.0)
    with pytest.raises(ValueError):
        per_target_throughput(runs, 2.0, 2.0)


def test_skewed_targets() -> None:
    ids = skewed_targets(16, 3)
    assert len(ids) == 19 and ids.count("busy") == 16 and set(ids[16:]) == {"small-1", "small-2", "small-3"}


def test_summarise_gamma_picks_the_best_fixed_and_the_ratios() -> None:
    pts = [
        GammaPoint("p", 3, "1", 100.0, 1.0),
        GammaPoint("p", 3, "4", 200.0, 4.0),
        GammaPoint("p", 3, "6", 250.0, 6.0),
        GammaPoint("p", 3, "adaptive", 240.0, 5.5),
        GammaPoint("p", 12, "4", 100.0, 4.0),  # no adaptive point: no summary
    ]
    (s,) = summarise_gamma(pts)
    assert (s.best_fixed, s.best_fixed_tokens_per_s) == ("6", 250.0)
    assert s.adaptive_vs_best == pytest.approx(0.96)
    assert s.adaptive_vs_gamma4 == pytest.approx(1.2)
    table = GammaReport(Machine.now(), pts, summarise_gamma(pts)).table()
    assert "0.960" in table and "1.200" in table


def test_parse_metrics_reads_unlabelled_samples() -> None:
    text = '# HELP x\nstarsd_draft_batch_size_sum 24.0\nstarsd_draft_batch_size_count 3.0\nother{a="b"} 1\n'
    names = ("starsd_draft_batch_size_sum", "starsd_draft_batch_size_count", "missing")
    assert parse_metrics(text, names) == {"starsd_draft_batch_size_sum": 24.0, "starsd_draft_batch_size_count": 3.0}


@pytest.mark.parametrize(("model", "emulate"), [(None, None), (Path("m"), 0.004)])
def test_a_benchmarks_draft_is_a_checkpoint_or_an_emulated_time(model: Path | None, emulate: float | None) -> None:
    async def enter() -> None:
        async with local_draft(model, emulate):
            pass

    with pytest.raises(ValueError, match="exactly one"):
        asyncio.run(enter())


def test_capacity_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    assert main(["bench", "capacity", "--draft-model", str(tmp_path / "none")]) == 2


def test_fairness_end_to_end_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fair.json"
    args = ["bench", "fairness", "--busy-sessions", "3", "--small-targets", "1", "--tq", "0.002", "--tp", "0.001"]
    assert main([*args, "--duration", "0.4", "--warmup", "0.1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [p["schedule"] for p in data["points"]] == ["fifo", "fair"]
    for p in data["points"]:
        assert set(p["per_target"]) == {"busy", "small-1"}
        assert 0.5 <= p["jain"] <= 1.0
    assert "Jain" in capsys.readouterr().out


def test_summarise_capacity_takes_medians_over_the_interleaved_passes() -> None:
    from starsd.bench.capacity import CapacityPoint, summarise_capacity

    def point(batch: int, rps: float, repeat: int, speedup: float) -> CapacityPoint:
        return CapacityPoint(batch, 32, 4, 0, 8.0, rps, 0.0, 0.0, speedup=speedup, repeat=repeat)

    points = [
        point(1, 100.0, 0, 1.0),
        point(8, 500.0, 0, 5.0),
        point(1, 200.0, 1, 1.0),
        point(8, 300.0, 1, 1.5),
        point(1, 150.0, 2, 1.0),
        point(8, 450.0, 2, 3.0),
    ]
    first, batched = summarise_capacity(points)
    assert (first.max_batch, first.requests_per_s, first.speedup) == (1, 150.0, 1.0)
    assert (batched.requests_per_s, batched.requests_per_s_min, batched.requests_per_s_max) == (450.0, 300.0, 500.0)
    assert batched.speedup == 3.0 and batched.speedups == [5.0, 1.5, 3.0]
