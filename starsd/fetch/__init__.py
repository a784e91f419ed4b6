"""Download a model checkpoint from where users keep it into a directory, and verify it (``starsd fetch-model``).

:func:`fetch_model` parses the URI (:mod:`starsd.modeluri`), takes a lock on the destination (pods sharing a
cache volume download a source once), returns at once when the destination already holds a complete,
intact download of the same source, and otherwise downloads with the scheme's client library
(:mod:`.hub`, :mod:`.bucket`, :mod:`.tarball`), checks the result (:mod:`.checkpoint`) and records it.
Every failure is a :class:`FetchError` whose message names the source and the cause.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from starsd import modeluri

from . import checkpoint
from .errors import FetchError

__all__ = ["FetchError", "Result", "fetch_model"]

log = logging.getLogger(__name__)

Fetcher = Callable[[modeluri.ModelURI, Path, Mapping[str, str], Callable[[int], None]], dict[str, int]]


@dataclass(frozen=True)
class Result:
    dest: Path
    files: dict[str, int]
    cached: bool  # the destination already held this source: nothing was downloaded

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def fetch_model(uri_text: str, dest: Path, env: Mapping[str, str]) -> Result:
    """Make ``dest`` a verified copy of the checkpoint at ``uri_text``."""
    try:
        uri = modeluri.parse(uri_text)
    except modeluri.URIError as exc:
        raise FetchError(str(exc)) from None
    try:
        dest.mkdir(parents=True, exist_ok=True)
        checkpoint.state_dir(dest).mkdir(exist_ok=True)
    except OSError as exc:
        raise FetchError(f"cannot create {dest}: {exc.strerror}") from None
    with _locked(dest):
        files = checkpoint.complete(dest, uri.text)
        if files is not None:
            log.info("%s is already in %s (%d files)", uri.text, dest, len(files))
            return Result(dest=dest, files=files, cached=True)
        expected = _fetcher(uri.scheme)(uri, dest, env, lambda needed: make_room(dest, needed))
        checkpoint.verify(dest, expected)
        checkpoint.write_record(dest, uri.text, expected)
    log.info("%s: %d files, %d bytes verified in %s", uri.text, len(expected), sum(expected.values()), dest)
    return Result(dest=dest, files=expected, cached=False)


def make_room(dest: Path, needed: int) -> None:
    """Refuse to start a download that cannot fit, naming both numbers."""
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise FetchError(
            f"no space left for the model in {dest}: it needs {_size(needed)} more, the volume has {_size(free)} free"
        )


def _fetcher(scheme: str) -> Fetcher:
    if scheme == "hf":
        from . import hub

        return hub.fetch
    if scheme in ("s3", "gs"):
        from . import bucket

        return bucket.fetch
    from . import tarball

    return tarball.fetch


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """One downloader per destination at a time (pods of one node, or of many on a volume whose locks work)."""
    with (checkpoint.state_dir(dest) / "lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{value:.1f} TiB"
