"""What the images install (starsd/ and operator/, per .dockerignore) needs nothing from the tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "starsd", ROOT / "operator" / "starsd_operator"]
TEST_ONLY = {"tests", "e2e", "pytest", "hypothesis"}


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_installed_packages_import_no_test_code() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {sorted(imported_roots(path.read_text()) & TEST_ONLY)}"
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        if imported_roots(path.read_text()) & TEST_ONLY
    ]
    assert offenders == []


def test_the_check_sees_an_import_of_test_code() -> None:
    assert imported_roots("from tests.support.faults import FaultProxy\nimport json") == {"tests", "json"}


def test_the_image_build_context_leaves_the_tests_out() -> None:
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"]
    assert "starsd" in allowed and not {"tests", "e2e"} & {entry.split("/")[0] for entry in allowed}


def imported_modules(source: str, package: str) -> set[str]:
    """Every module a file names at import time (relative imports resolved against `package`)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            modules.add(module)
            modules.update(f"{module}.{alias.name}" for alias in node.names)
    return modules


def http_imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).parent.parts)
    return {
        name
        for name in imported_modules(path.read_text(), package)
        if name.split(".")[0] == "aiohttp" or name.startswith("starsd.openai_api")
    }


def test_the_engine_imports_nothing_of_http() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(found)
        for path in sorted((ROOT / "starsd" / "verifier").rglob("*.py"))
        if (found := http_imports(path))
    }
    assert offenders == {}


def test_the_engine_check_sees_http_imports() -> None:
    source = "from ..openai_api.errors import RequestError\nfrom aiohttp import web\nimport torch"
    found = {n for n in imported_modules(source, "starsd.verifier") if n.startswith(("starsd.openai_api", "aiohttp"))}
    assert found == {"starsd.openai_api.errors", "starsd.openai_api.errors.RequestError", "aiohttp", "aiohttp.web"}
