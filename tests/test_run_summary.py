"""The run's closing block lists what did not run and why (tests/support/run_summary.py)."""

from __future__ import annotations

import pytest

from tests.support.run_summary import REPO, not_run_lines


def skipped(reason: str, n: int) -> list[object]:
    return [
        pytest.TestReport(f"t{i}", ("t.py", i, f"t{i}"), {}, "skipped", ("t.py", i, f"Skipped: {reason}"), "setup")
        for i in range(n)
    ]


def test_skips_are_counted_by_reason_most_first_with_the_deselected() -> None:
    reports = {"skipped": skipped("no CUDA device is visible", 2) + skipped("a long variant", 5), "deselected": [1] * 3}
    lines = not_run_lines(reports, "not slow", [str(REPO / "tests" / "test_x.py")])
    assert lines == [
        "    5 skipped: a long variant",
        "    2 skipped: no CUDA device is visible",
        '    3 deselected by -m "not slow"',
    ]


def test_a_whole_suite_run_names_the_suites_it_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REAL_NODE", raising=False)
    both = "\n".join(not_run_lines({}, "", [str(REPO / "tests"), str(REPO / "e2e")]))
    assert "e2e/real: not run" in both and "REAL_NODE=1" in both and "images/smoke: not run" in both
    assert "- e2e: not run" not in both
    unit = "\n".join(not_run_lines({}, "", [str(REPO / "tests")]))
    assert "- e2e: not run" in unit
    monkeypatch.setenv("REAL_NODE", "1")
    assert "e2e/real" not in "\n".join(not_run_lines({}, "", [str(REPO / "e2e")]))


def test_a_run_of_a_few_files_with_nothing_left_out_prints_nothing() -> None:
    assert not_run_lines({}, "", [str(REPO / "tests" / "test_x.py")]) == []
