"""Figures in the READMEs have one source: the model sizes come from models/report.json (through the README
that `make models` generates), never restated by hand in README.md where they drift."""

from __future__ import annotations

import json
import re

from starsd.paths import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
REPORT = json.loads((REPO_ROOT / "models" / "report.json").read_text())
MODELS_README = (REPO_ROOT / "models" / "README.md").read_text()

# "~4M-parameter", "2.2M parameters", "10x smaller", "231,744 parameters"
SIZE_CLAIM = re.compile(r"(\d[\d,.]*\s*[KkMB]?[- ]parameters?\b|\d+(\.\d+)?x (smaller|fewer|larger))")


def test_readme_states_no_model_size_of_its_own_and_links_the_generated_one() -> None:
    assert SIZE_CLAIM.findall(README) == []
    assert "[models/README.md](models/README.md)" in README


def test_the_size_pattern_catches_what_drifted_before() -> None:
    assert SIZE_CLAIM.search("a ~4M-parameter target and a ~10x smaller draft")
    assert SIZE_CLAIM.search("**231,744 parameters**")


def test_the_generated_models_readme_agrees_with_the_report() -> None:
    for role in ("target", "draft"):
        assert f"**{REPORT['models'][role]['parameters']:,} parameters**" in MODELS_README, role
