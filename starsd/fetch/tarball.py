"""``https://HOST/PATH/MODEL.tar.gz``: one tarball of a checkpoint directory, downloaded with requests.

The tarball goes to ``DEST/.starsd/download.part``; a part left by an interrupted run is resumed with a
``Range`` request guarded by ``If-Range`` (the server's ETag or Last-Modified: a changed file comes back
whole, with 200, and the download starts over). It is unpacked with tarfile's ``data`` filter (no absolute
paths, no links out of the directory, no devices); a tarball whose only entry is one directory is unpacked
from inside that directory. ``STARSD_HTTP_AUTHORIZATION`` (from the credentials Secret) is sent as the
``Authorization`` header; ``SSL_CERT_FILE`` / ``REQUESTS_CA_BUNDLE`` name a private CA.
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from starsd.modeluri import ModelURI

from .checkpoint import state_dir
from .errors import FetchError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
ATTEMPTS = 3  # a cut connection is resumed in-process this often before the run gives up (and keeps the part)
RETRY_SECONDS = 0.5
TIMEOUT = (10.0, 60.0)  # connect, read (between bytes)
REASONS = {
    401: "Unauthorized: the server wants credentials (STARSD_HTTP_AUTHORIZATION in credentials.secretRef)",
    403: "Forbidden: the credentials may not read this file",
    404: "Not Found: no file at this URL",
}


def fetch(uri: ModelURI, dest: Path, env: Mapping[str, str], make_room: Callable[[int], None]) -> dict[str, int]:
    """Download and unpack ``uri`` into ``dest``; returns the unpacked files and their sizes."""
    import requests

    state = state_dir(dest)
    state.mkdir(parents=True, exist_ok=True)
    part = state / "download.part"
    validator_file = state / "download.validator"
    headers = {"Accept-Encoding": "identity"}
    if env.get("STARSD_HTTP_AUTHORIZATION"):
        headers["Authorization"] = env["STARSD_HTTP_AUTHORIZATION"]
    verify: str | bool = env.get("REQUESTS_CA_BUNDLE") or env.get("SSL_CERT_FILE") or True
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _download(uri, part, validator_file, headers, verify, make_room, requests)
            break
        except FetchError:
            raise
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
            have = part.stat().st_size if part.exists() else 0
            if attempt == ATTEMPTS or isinstance(exc, requests.exceptions.SSLError):
                raise FetchError(
                    f"{uri.text}: {type(exc).__name__} after {attempt} attempts, {have} bytes kept "
                    f"(the next run resumes from there): {_first_line(exc)}"
                ) from None
            log.warning("%s: %s at byte %d; resuming", uri.text, type(exc).__name__, have)
            time.sleep(RETRY_SECONDS * attempt)
        except requests.RequestException as exc:
            raise FetchError(f"{uri.text}: {type(exc).__name__}: {_first_line(exc)}") from None
        except OSError as exc:
            if exc.errno == 28:
                raise FetchError(f"{uri.text}: no space left on device while downloading") from None
            raise
    files = _unpack(uri, part, dest, make_room)
    part.unlink()
    validator_file.unlink(missing_ok=True)
    return files


def _download(
    uri: ModelURI,
    part: Path,
    validator_file: Path,
    headers: dict[str, str],
    verify: str | bool,
    make_room: Callable[[int], None],
    requests: Any,
) -> None:
    have = part.stat().st_size if part.exists() else 0
    validator = validator_file.read_text() if validator_file.exists() else ""
    request = dict(headers)
    if have and validator:
        request["Range"] = f"bytes={have}-"
        request["If-Range"] = validator
    with requests.get(uri.url, headers=request, stream=True, timeout=TIMEOUT, verify=verify) as response:
        if response.status_code in REASONS or response.status_code >= 400:
            reason = REASONS.get(response.status_code, response.reason)
            raise FetchError(f"{uri.text}: {response.status_code} {reason}")
        if response.status_code == 206:
            log.info("%s: resuming at byte %d", uri.text, have)
            mode = "ab"
            total = _total_from_range(response.headers.get("Content-Range")) or have + int(
                response.headers.get("Content-Length") or 0
            )
        else:
            have, mode = 0, "wb"
            total = int(response.headers.get("Content-Length") or 0)
        validator_file.write_text(response.headers.get("ETag") or response.headers.get("Last-Modified") or "")
        # The tarball and, at worst, its unpacked copy beside it.
        make_room(2 * max(total - have, 0))
        with part.open(mode) as out:
            for chunk in response.iter_content(CHUNK):
                out.write(chunk)
    got = part.stat().st_size
    if total and got != total:
        raise FetchError(f"{uri.text}: the download ended at {got} of {total} bytes (the connection was cut off)")


def _total_from_range(value: str | None) -> int | None:
    """The full length from ``Content-Range: bytes A-B/TOTAL``."""
    if not value or "/" not in value:
        return None
    total = value.rsplit("/", 1)[1]
    return int(total) if total.isdigit() else None


def _unpack(uri: ModelURI, tarball: Path, dest: Path, make_room: Callable[[int], None]) -> dict[str, int]:
    unpack = state_dir(dest) / "unpack"
    shutil.rmtree(unpack, ignore_errors=True)
    unpack.mkdir()
    try:
        with tarfile.open(tarball, "r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
            make_room(sum(m.size for m in members if m.isfile()))
            tar.extractall(unpack, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno == 28:
            raise FetchError(f"{uri.text}: no space left on device while unpacking") from None
        raise FetchError(f"{uri.text}: not a readable tarball: {_first_line(exc)}") from None
    root = unpack
    entries = list(unpack.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        root = entries[0]
    files: dict[str, int] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.stat().st_size
    for entry in root.iterdir():
        target = dest / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        entry.replace(target)
    shutil.rmtree(unpack, ignore_errors=True)
    log.info("%s: unpacked %d files", uri.text, len(files))
    return files


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
