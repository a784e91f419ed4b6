"""The command modules: every `starsd bench` benchmark runs its own module's `run`, and no module under
starsd/commands imports one that imports it back (directly or round a longer loop), nor anywhere in the two
installed packages."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from starsd.cli import build_parser
from starsd.commands import bench
from starsd.commands._common import counts, positive_ints, target_counts

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ROOT / "starsd" / "commands"


def module_name(path: Path, base: Path = ROOT) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str], base: Path = ROOT) -> set[str]:
    """The modules in ``known`` that ``path`` imports, at its top or inside a function (relative imports
    resolved against the file's own package)."""
    package = module_name(path, base) if path.name == "__init__.py" else module_name(path, base).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            anchor = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (anchor, node.module or "") if part)
            for alias in node.names:
                name = f"{module}.{alias.name}"
                found.add(name if name in known else module)
    return found & known


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every loop of imports, each once, as the modules round it (depth-first search)."""
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                loops.append(path[path.index(nxt) :])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return loops


def test_no_import_cycle_under_starsd_commands() -> None:
    files = sorted(COMMANDS.rglob("*.py"))
    known = {module_name(p) for p in files}
    graph = {module_name(p): imports_of(p, known) - {module_name(p)} for p in files}
    assert graph["starsd.commands.bench"] >= {"starsd.commands.bench.star", "starsd.commands.bench.step"}
    assert cycles(graph) == []


@pytest.mark.parametrize(("base", "package"), [(ROOT, "starsd"), (ROOT / "operator", "starsd_operator")])
def test_no_import_cycle_in_the_installed_packages(base: Path, package: str) -> None:
    files = sorted((base / package).rglob("*.py"))
    known = {module_name(p, base) for p in files}
    graph = {module_name(p, base): imports_of(p, known, base) - {module_name(p, base)} for p in files}
    assert sum(len(edges) for edges in graph.values()) > len(files)  # the names resolve: the graph has its edges
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_benchmark_runs_its_own_modules_run() -> None:
    parser = build_parser(["bench"])
    bench_parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    subs = next(a for a in bench_parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    modules = {m.__name__.rsplit(".", 1)[1].replace("_", "-"): m for m in bench.BENCHMARKS}
    assert list(subs) == list(modules)
    for name, sub in subs.items():
        assert sub.get_default("_bench") is modules[name].run, name


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (positive_ints, "1,x", "expected comma-separated integers, got '1,x'"),
        (positive_ints, "0,8", "values must be >= 1, got '0,8'"),
        (counts, "-1", "values must be >= 0, got '-1'"),
        (target_counts, "a", "expected comma-separated target counts, got 'a'"),
        (target_counts, "", "target counts must be >= 1, got ''"),
    ],
)
def test_list_arguments_say_what_they_expect(parse: object, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)  # type: ignore[operator]
    assert str(err.value) == message


def test_list_arguments_keep_the_order_given() -> None:
    assert target_counts("8, 1,8") == (8, 1, 8)
    assert counts("0,128") == (0, 128)
