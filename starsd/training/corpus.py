"""The training text: the Python standard library's ``.py`` sources, found the same way on every machine.

The file list is sorted, test suites and third-party packages are left out, and a file belongs to the held-out
split when a hash of its path relative to the library root says so, so the split does not depend on the order in
which files are listed or on which other files exist.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Directory names whose files are never read: test suites (large, repetitive, sometimes not UTF-8), third-party
# packages, caches, and the generated codec tables in ``encodings/`` (a hundred near-identical files of hex
# literals, which would teach little and make held-out text unrealistically easy to predict).
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings"})
# Larger files are skipped: a few generated tables (e.g. pydoc's topic index) would otherwise dominate.
MAX_FILE_BYTES = 256 * 1024
# One file in HELD_OUT_MODULUS goes to the held-out split.
HELD_OUT_MODULUS = 20


@dataclass(frozen=True)
class Document:
    """One source file: its path relative to the library root, and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The training and held-out documents, each list sorted by name."""

    root: Path
    train: tuple[Document, ...]
    held_out: tuple[Document, ...]

    def fingerprint(self) -> str:
        """sha256 over every document's name and text: equal digests mean the same training input."""
        digest = hashlib.sha256()
        for split, docs in (("train", self.train), ("held_out", self.held_out)):
            for doc in docs:
                digest.update(f"{split}\0{doc.name}\0".encode())
                digest.update(doc.text.encode("utf-8"))
        return digest.hexdigest()

    def train_chars(self) -> int:
        return sum(len(d.text) for d in self.train)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(name: str, modulus: int = HELD_OUT_MODULUS) -> bool:
    """Whether the document ``name`` (a relative POSIX path) belongs to the held-out split."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % modulus == 0


def list_sources(root: Path) -> list[Path]:
    """The ``.py`` files under ``root`` that the corpus uses, sorted by relative path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune excluded directories (site-packages alone can hold more files than the library itself).
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(".py") and path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def read_documents(root: Path, paths: Iterable[Path]) -> list[Document]:
    docs = []
    for path in paths:
        # The library's sources are UTF-8; a stray undecodable byte becomes U+FFFD rather than an error.
        text = path.read_bytes().decode("utf-8", errors="replace")
        if text.strip():
            docs.append(Document(path.relative_to(root).as_posix(), text))
    return docs


def split_documents(docs: Sequence[Document]) -> tuple[tuple[Document, ...], tuple[Document, ...]]:
    train = tuple(d for d in docs if not is_held_out(d.name))
    held_out = tuple(d for d in docs if is_held_out(d.name))
    return train, held_out


def load_corpus(root: Path | None = None, limit: int | None = None) -> Corpus:
    """Read the corpus under ``root`` (default: this interpreter's standard library).

    ``limit`` keeps only the first ``limit`` files of the sorted list (for quick runs and tests).
    """
    root = stdlib_root() if root is None else root
    paths = list_sources(root)
    if limit is not None:
        paths = paths[:limit]
    if not paths:
        raise FileNotFoundError(f"no Python sources found under {root}")
    train, held_out = split_documents(read_documents(root, paths))
    return Corpus(root=root, train=train, held_out=held_out)
