"""`starsd draft --cpus`: CPU lists read as Linux writes them, and a draft whose processes all run on them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from starsd import procfs
from starsd.cpus import CpuListError, format_cpu_list, parse_cpu_list, unavailable
from starsd.local import free_port


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", {0}), ("0-3,8", {0, 1, 2, 3, 8}), ("2, 4-5", {2, 4, 5}), ("7-7", {7}), ("1,1,0-1", {0, 1})],
)
def test_cpu_lists_are_read_as_linux_writes_them(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "3-1", "0,,1", "1.5"])
def test_a_malformed_cpu_list_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(CpuListError, match=re.escape(repr(text))):
        parse_cpu_list(text)


def test_cpu_lists_are_written_shortest() -> None:
    assert format_cpu_list({8, 0, 1, 2, 3}) == "0-3,8"
    assert format_cpu_list({5}) == "5"
    assert format_cpu_list({1, 3, 4}) == "1,3-4"
    assert parse_cpu_list(format_cpu_list({0, 2, 3, 9, 10, 11})) == {0, 2, 3, 9, 10, 11}


def test_cores_outside_the_allowed_set_are_named() -> None:
    assert unavailable(frozenset({0}), {0, 1}) is None
    problem = unavailable(frozenset({1, 6, 7}), {0, 1, 2})
    assert problem == "CPU 6-7 is not among the cores this process may use (0-2)"


def _allowed(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return set(parse_cpu_list(line.split(":", 1)[1]))
    raise AssertionError(f"no Cpus_allowed_list for process {pid}")


def _draft(model: Path, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "starsd.cli", "draft", "--model", str(model)]
    return [*command, "--host", "127.0.0.1", "--port", str(free_port()), "--metrics-port", str(free_port()), *extra]


def test_the_draft_and_its_model_process_run_on_the_given_cores(random_pair: tuple[Path, Path]) -> None:
    core = max(os.sched_getaffinity(0))  # not the first: where a test runs unpinned, its children start on all
    server = subprocess.Popen(_draft(random_pair[0], "--cpus", str(core)), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        models: list[int] = []
        while time.monotonic() < deadline and not models:
            models = [
                p for p in procfs.descendants(server.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()
            ]
            time.sleep(0.2)
        assert models, "no model process appeared below the draft"
        assert _allowed(server.pid) == {core}
        assert [_allowed(p) for p in models] == [{core}] * len(models)
    finally:
        server.terminate()
        server.wait(30)


def test_cores_the_draft_may_not_use_are_refused_before_it_starts(random_pair: tuple[Path, Path]) -> None:
    beyond = max(os.sched_getaffinity(0)) + 1
    done = subprocess.run(_draft(random_pair[0], "--cpus", f"0,{beyond}"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"--cpus: CPU {beyond} is not among the cores this process may use" in done.stderr
    assert "loaded" not in done.stderr  # refused before any model was loaded
