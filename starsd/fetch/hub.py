"""``hf://ORG/NAME[@REVISION]``: a Hugging Face Hub repository, downloaded with huggingface_hub.

huggingface_hub does the protocol (revision resolution, the file tree, resumable ``.incomplete`` downloads
kept under ``DEST/.cache/huggingface``); this module lists the files first (to check the space and, after
the download, the sizes) and turns the library's exceptions into one sentence with the HTTP status.
``HF_TOKEN`` and ``HF_ENDPOINT`` (a mirror) come from the environment, as everywhere huggingface_hub runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from starsd.modeluri import ModelURI

from .errors import FetchError

log = logging.getLogger(__name__)


def fetch(uri: ModelURI, dest: Path, env: Mapping[str, str], make_room: Callable[[int], None]) -> dict[str, int]:
    """Download ``uri`` into ``dest``; returns the repository's files and sizes (what ``dest`` must hold)."""
    from huggingface_hub import snapshot_download

    kwargs: dict[str, Any] = {
        "repo_id": uri.name,
        "revision": uri.revision,
        "local_dir": str(dest),
        "token": env.get("HF_TOKEN") or False,
        "endpoint": env.get("HF_ENDPOINT") or None,
    }
    try:
        plan = snapshot_download(**kwargs, dry_run=True)
        expected = {info.filename: int(info.file_size or 0) for info in plan}
        make_room(sum(size for info, size in zip(plan, expected.values(), strict=True) if info.will_download))
        log.info("%s: %d files, %d bytes", uri.text, len(expected), sum(expected.values()))
        snapshot_download(**kwargs)
    except FetchError:
        raise
    except Exception as exc:
        raise FetchError(describe(uri, exc, token_given=bool(env.get("HF_TOKEN")))) from None
    return expected


def describe(uri: ModelURI, exc: BaseException, *, token_given: bool) -> str:
    """One sentence for a failed Hub download: the status, what it means here, and the library's words."""
    from huggingface_hub import errors

    exc = _root_cause(exc)
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    where = f"{uri.text}"
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, errors.GatedRepoError):
        return f"{where}: {status} gated repository: accept its terms on the Hub with the token's account"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{where}: {status} revision {uri.revision!r} not found"
    if status == 401:
        hint = "the token in HF_TOKEN was refused" if token_given else "the repository needs a token (HF_TOKEN)"
        return f"{where}: 401 Unauthorized: {hint}, or the repository does not exist"
    if status == 403:
        return f"{where}: 403 Forbidden: the token in HF_TOKEN may not read this repository"
    if isinstance(exc, errors.RepositoryNotFoundError) or status == 404:
        return f"{where}: 404 repository {uri.name!r} not found"
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return f"{where}: no space left on device while downloading"
    if status is not None:
        return f"{where}: HTTP {status}: {first_line}"
    return f"{where}: {type(exc).__name__}: {first_line}"


def _root_cause(exc: BaseException) -> BaseException:
    """The HTTP error behind a wrapper (a dry run's ``DryRunError`` hides the 401 or 404 that caused it)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(getattr(current, "response", None), "status_code", None) is not None:
            return current
        current = current.__cause__ or current.__context__
    return exc
