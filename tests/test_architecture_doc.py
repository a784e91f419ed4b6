"""docs/architecture.md points at code as `path.py:Name` (a class's member as `path.py:Class.member`): every such
pointer names a file that exists and a name that file defines, and no pointer is left in the older form
`path.py` `Name`, whose file a reader had to guess from the neighbouring words."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

POINTER = re.compile(r"`([\w./-]+\.py):([A-Za-z_][\w.]*)`")
OLD_FORM = re.compile(r"`[\w./-]+\.py`\s+`[A-Za-z_]")


def pointers(text: str) -> list[tuple[str, str]]:
    return POINTER.findall(text)


def names_in(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body defines: functions, classes and assigned names."""
    found: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def defines(path: Path, symbol: str) -> bool:
    """Whether ``path`` defines ``symbol`` (``Name`` or ``Class.member``, classes nested as deep as named)."""
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    parts = symbol.split(".")
    for i, part in enumerate(parts):
        node = names_in(body).get(part)
        if node is None:
            return False
        if i < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            body = node.body
    return True


def test_every_pointer_names_a_symbol_its_file_defines() -> None:
    found = pointers(DOC.read_text())
    assert len(found) >= 40  # section 4 alone names more; fewer means the pattern no longer matches the doc
    wrong = [
        f"{path}:{symbol}" for path, symbol in found if not (ROOT / path).is_file() or not defines(ROOT / path, symbol)
    ]
    assert wrong == []


def test_no_pointer_is_left_in_the_older_form() -> None:
    assert OLD_FORM.findall(DOC.read_text()) == []


def test_the_check_refuses_a_pointer_to_the_wrong_file() -> None:
    assert defines(ROOT / "starsd/draft/runner.py", "DraftRunner.propose_batch")
    assert not defines(ROOT / "starsd/draft/model_process.py", "DraftRunner.propose_batch")
    assert not defines(ROOT / "starsd/draft/runner.py", "DraftRunner.no_such_method")
    assert pointers("see `starsd/a.py:B.c` and `starsd/d.py`") == [("starsd/a.py", "B.c")]
    assert OLD_FORM.findall("`starsd/cli.py` `main`")
