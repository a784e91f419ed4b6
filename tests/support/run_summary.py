"""The end of a test run says, in one short block, what it did not run and why (a pytest plugin).

Skipped tests are counted by reason (no GPU, a soak-only variant, ...), deselected ones by the ``-m``
expression that left them out, and the suites that are not even collected without their switch are named
with the command that runs them. Loaded for every run by the repository's root ``conftest.py``.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Suites a whole-suite run leaves out: (folder, the switch that collects it, how to run it).
OPT_IN_SUITES = (
    ("e2e", None, "`make e2e` or `make test`: a local Kubernetes control plane"),
    ("e2e/real", "REAL_NODE", "REAL_NODE=1, `make e2e-real`: a real node, root, containerd and the images"),
    ("images/smoke", None, "`make images-test`: the images as containers"),
)
SUITE_ROOTS = ("", "tests", "e2e")  # a run of one of these is a whole-suite run


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def not_run_lines(reports: dict[str, list[object]], markexpr: str, args: list[str]) -> list[str]:
    """The block's lines: skips by reason (most first), deselections, and suites outside this run."""
    lines = []
    skipped = Counter(
        _reason(r) for r in reports.get("skipped", []) if isinstance(r, pytest.TestReport | pytest.CollectReport)
    )
    for reason, n in skipped.most_common():
        lines.append(f"{n:5d} skipped: {reason}")
    deselected = len(reports.get("deselected", []))
    if deselected:
        why = f'by -m "{markexpr}"' if markexpr else "by the command line"
        lines.append(f"{deselected:5d} deselected {why}")
    ran = [Path(a.split("::")[0]).resolve() for a in args if not a.startswith("-")] or [Path.cwd()]
    if any(r == REPO / root for r in ran for root in SUITE_ROOTS):  # not for a run of a few files
        for folder, switch, how in OPT_IN_SUITES:
            path = REPO / folder
            covered = any(path == r or r in path.parents for r in ran)
            if (switch is not None and os.environ.get(switch) == "1") or (switch is None and covered):
                continue
            lines.append(f"    - {folder}: not run ({how})")
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = not_run_lines(terminalreporter.stats, config.option.markexpr or "", list(config.args))
    if lines:
        terminalreporter.section("not run, and why", sep="-")
        for line in lines:
            terminalreporter.line(line)
