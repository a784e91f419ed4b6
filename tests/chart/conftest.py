"""Fixtures for the chart tests: a helm binary (built by e2e/cluster/cluster.sh when missing) and a renderer."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "starsd"
VALUES_DIR = Path(__file__).parent / "values"
# The registry the tests render with: the chart refuses to render without one (image.registry).
REGISTRY = "registry.example"
WITH_REGISTRY = ("--set", f"image.registry={REGISTRY}")


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of a helm binary: $HELM, else the one the cluster script builds (cached after the first time)."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    if not shutil.which("go") and not shutil.which("helm"):
        pytest.skip("neither Go (to build helm with e2e/cluster/cluster.sh) nor helm is installed")
    if not shutil.which("go"):
        return str(shutil.which("helm"))
    proc = subprocess.run(
        ["bash", str(REPO / "e2e/cluster/cluster.sh"), "build-helm"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"building helm failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


class Rendered(list[dict[str, Any]]):
    """The documents `helm template` printed, with lookups by kind and name."""

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self if d["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].endswith(name_suffix)]
        names = [d["metadata"]["name"] for d in found]
        assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {names}"
        return found[0]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="session")
def render(helm: str) -> Callable[..., Rendered]:
    """render(*values_files, release=..., sets=[...]) -> the rendered documents, with image.registry set to
    REGISTRY; fails on a helm error."""

    def _render(*values_files: str, release: str = "rel", sets: tuple[str, ...] = ()) -> Rendered:
        args = ["template", release, str(CHART), "--namespace", "starsd-system", *WITH_REGISTRY]
        for f in values_files:
            args += ["-f", str(VALUES_DIR / f)]
        for s in sets:
            args += ["--set", s]
        proc = run_helm(helm, *args)
        assert proc.returncode == 0, f"helm template failed: {proc.stderr}"
        return Rendered(d for d in yaml.safe_load_all(proc.stdout) if d)

    return _render
