"""Every relative link in crds/, charts/, docs/ and the README leads somewhere: markdown links resolve to a file
(and to a heading, for an anchor), and the ``docs/....md`` a CRD description or a chart comment names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("crds", "charts", "docs")
SCANNED_FILES = ("README.md",)
TEXT_SUFFIXES = {".md", ".yaml", ".yml", ".tpl", ".txt", ".json"}
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path to a doc, as a description or a comment names it: docs/x.md, docs/x.md#anchor.
DOC_MENTION = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)(#[\w-]+)?")
FENCE = re.compile(r"^\s*(```|~~~)")


def scanned_files() -> list[Path]:
    return sorted(
        [
            p
            for top in SCANNED
            for p in (REPO / top).rglob("*")
            if p.is_file() and p.suffix in TEXT_SUFFIXES and not p.is_symlink()
        ]
        + [REPO / name for name in SCANNED_FILES]
    )


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in markdown.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.add(slug(m.group(1)))
    return out


def unfenced(path: Path) -> str:
    """A markdown file without its code blocks (an example there is not a link); other files whole."""
    if path.suffix != ".md":
        return path.read_text()
    kept, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def broken(source: Path, target: Path, anchor: str) -> str | None:
    where = source.relative_to(REPO)
    if not target.exists():
        return f"{where}: {target.relative_to(REPO) if target.is_relative_to(REPO) else target} does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{where}: {target.relative_to(REPO)} has no heading #{anchor}"
    return None


def problems(path: Path) -> list[str]:
    text = unfenced(path)
    found: list[str] = []
    if path.suffix == ".md":
        for link in MARKDOWN_LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto: ...
                continue
            file_part, _, anchor = link.partition("#")
            target = (path.parent / file_part).resolve() if file_part else path
            found.append(broken(path, target, anchor) or "")
    for mention, anchor in DOC_MENTION.findall(text):
        found.append(broken(path, REPO / mention, anchor.lstrip("#")) or "")
    return [p for p in found if p]


def test_the_scan_covers_the_crd_the_chart_and_the_docs() -> None:
    names = {str(p.relative_to(REPO)) for p in scanned_files()}
    assert {"crds/starsdcluster.yaml", "charts/starsd/README.md", "docs/models-and-pods.md", "README.md"} <= names
    assert {"docs/gpu-nodes.md", "docs/node-failure.md"} <= names


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert problems(path) == []


def test_a_broken_link_a_missing_anchor_and_a_missing_doc_are_caught(tmp_path: Path) -> None:
    page = REPO / "docs" / "models-and-pods.md"
    assert "pod-templates" in anchors(page) and slug("Rolling changes, one pool at a time") in anchors(page)
    assert broken(page, REPO / "docs" / "pod-templates.md", "") is not None
    assert broken(page, page, "no-such-heading") is not None
    assert broken(page, page, "pod-templates") is None
    assert DOC_MENTION.findall("Merge rules: docs/pod-templates.md.") == [("docs/pod-templates.md", "")]
