"""What a downloaded checkpoint directory must hold, and the record that says a download is complete.

A download is complete when every file the source listed is on disk at its listed size, the directory holds
a ``config.json`` that parses and a tokenizer, and ``.starsd/complete.json`` records the source and the file
list. The record is written last, so a download cut off at any point is never mistaken for a finished one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from .errors import FetchError

# Bookkeeping inside the destination: partial downloads, the lock, the completion record.
STATE_DIR = ".starsd"
RECORD = "complete.json"
# Directories a downloader keeps beside the files (huggingface_hub's local_dir metadata); not the model's.
IGNORED_DIRS = (STATE_DIR, ".cache")
# A tokenizer in any of the layouts transformers loads.
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))


def state_dir(dest: Path) -> Path:
    return dest / STATE_DIR


def files_on_disk(dest: Path) -> dict[str, int]:
    """Every file under ``dest`` (relative POSIX path -> size), bookkeeping directories left out."""
    found: dict[str, int] = {}
    for root, dirs, files in os.walk(dest):
        rel_root = Path(root).relative_to(dest)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if d not in IGNORED_DIRS]
        for name in files:
            path = Path(root) / name
            found[(rel_root / name).as_posix()] = path.stat().st_size
    return found


def missing_or_wrong(expected: Mapping[str, int], found: Mapping[str, int]) -> list[str]:
    """What differs between the source's listing and the disk: one line per file, sorted."""
    problems = []
    for name, size in sorted(expected.items()):
        if name not in found:
            problems.append(f"{name} is missing")
        elif found[name] != size:
            problems.append(f"{name} has {found[name]} bytes, the source lists {size}")
    return problems


def check_layout(dest: Path, files: Mapping[str, int]) -> None:
    """``config.json`` present and parsable, a tokenizer present; raises :class:`FetchError` otherwise."""
    if "config.json" not in files:
        raise FetchError(f"{dest} holds no config.json: the source is not a Hugging Face checkpoint directory")
    try:
        config = json.loads((dest / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise FetchError(f"{dest}/config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise FetchError(f"{dest}/config.json is not a JSON object")
    if not any(all(name in files for name in layout) for layout in TOKENIZER_FILES):
        wanted = " or ".join("+".join(layout) for layout in TOKENIZER_FILES)
        raise FetchError(f"{dest} holds no tokenizer ({wanted}): the draft and target need one")


def verify(dest: Path, expected: Mapping[str, int]) -> dict[str, int]:
    """Check ``dest`` against the source's listing and the checkpoint layout; returns the files found."""
    found = files_on_disk(dest)
    problems = missing_or_wrong(expected, found)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise FetchError(f"the download into {dest} is incomplete: {shown}")
    check_layout(dest, found)
    return found


def write_record(dest: Path, source: str, files: Mapping[str, int]) -> None:
    """Mark ``dest`` complete (atomically: a rename)."""
    state = state_dir(dest)
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / f"{RECORD}.tmp"
    tmp.write_text(json.dumps({"source": source, "files": dict(sorted(files.items()))}, indent=1))
    tmp.replace(state / RECORD)


def complete(dest: Path, source: str) -> dict[str, int] | None:
    """The recorded files when ``dest`` holds a complete download of ``source`` still intact, else ``None``."""
    try:
        record = json.loads((state_dir(dest) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("source") != source or not isinstance(record.get("files"), dict):
        return None
    files = {str(k): int(v) for k, v in record["files"].items()}
    if missing_or_wrong(files, files_on_disk(dest)):
        return None
    return files
