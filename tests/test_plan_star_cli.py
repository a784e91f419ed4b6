"""`starsd plan --gpus G --draft-cost X --target-cost Y`: the best (D, N), through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from starsd import system_model
from starsd.cli import main

BASE = ["plan", "--tq", "0.004", "--tp", "0.02", "--tc", "0.001", "--gamma", "4", "--alpha", "0.8"]


def plan(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main([*BASE, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_gives_the_models_best_d_and_n(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "--gpus", "16", "--draft-cost", "1", "--target-cost", "10", "--json")
    assert code == 0
    star = json.loads(out)["star"]
    want = system_model.best_star(16, 0.004, 0.02, 0.001, 4, alpha=0.8, draft_cost=1, target_cost=10)
    assert star["gpus"] == 16 and star["optimal_targets"] == 7
    assert (star["best_throughput"]["drafts"], star["best_throughput"]["targets"]) == (
        want.best_throughput.drafts,
        want.best_throughput.targets,
    )
    assert (star["best_per_cost"]["drafts"], star["best_per_cost"]["targets"]) == (2, 12)
    assert star["best_per_cost"]["cost"] == pytest.approx(2 * 1 + 12 * 10)
    assert [o["drafts"] for o in star["by_drafts"]] == list(range(1, 16))


def test_table_names_the_best_and_marks_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "--gpus", "16")
    assert code == 0
    assert "best by throughput:          D = 2 drafts, N = 14 targets" in out
    assert "best by throughput per cost: D = 2 drafts, N = 12 targets" in out
    marked = [line.split() for line in out.splitlines() if "<- best" in line]
    assert [(int(m[0]), int(m[1])) for m in marked] == [(2, 14)]  # by_drafts shows D's best N by throughput
    assert "throughput" in " ".join(marked[0])


def test_without_gpus_the_output_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    _, plain, _ = plan(capsys)
    _, with_gpus, _ = plan(capsys, "--gpus", "8")
    assert with_gpus.startswith(plain.rstrip("\n") + "\n\n8 accelerators")
    _, plain_json, _ = plan(capsys, "--json")
    assert "star" not in json.loads(plain_json)


def test_batch_curve_plans_with_the_batched_n_star(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "--batch-curve", "8:0.006", "--gpus", "40", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["star"]["optimal_targets"] == report["optimal_targets"] > 7


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "1"], "--gpus must be >= 2"),
        (["--gpus", "8", "--draft-cost", "0"], "--draft-cost must be a number > 0"),
        (["--gpus", "8", "--target-cost", "-1"], "--target-cost must be a number > 0"),
        (["--gpus", "8", "--target-cost", "nan"], "--target-cost must be a number > 0"),
    ],
)
def test_bad_values_are_refused_clearly(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    code, out, err = plan(capsys, *extra)
    assert code == 2
    assert out == ""
    assert message in err


def test_help_explains_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    for flag in ("--gpus", "--draft-cost", "--target-cost"):
        assert flag in out
    assert "D x N*" in out
