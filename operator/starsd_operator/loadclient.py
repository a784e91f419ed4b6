"""Reading the draft's ``GET /v1/load``.

Synchronous on purpose: kopf runs the operator's sync handlers in a thread pool, and one short request with
a hard timeout per tick needs no event loop of its own.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import constants as c
from . import naming
from .naming import Owner
from .rebalancer import Load, aggregate

DEFAULT_TIMEOUT = 3.0
MAX_BODY = 64 * 1024


class LoadUnavailable(RuntimeError):
    """The load could not be read or did not make sense; the message says which and why."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: a load URL is read where it points, never where its server sends us."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} refused", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirects)


def load_url(owner: Owner, annotations: Mapping[str, Any] | None) -> str:
    """The ``starsd.io/load-url`` annotation when set in ``annotations``, else the draft Service's in-cluster
    address (the caller passes ``None`` unless the operator allows the annotation)."""
    url = (annotations or {}).get(c.ANNOTATION_LOAD_URL)
    return str(url).strip() if isinstance(url, str) and url.strip() else naming.default_load_url(owner)


def load_urls(
    owner: Owner, annotations: Mapping[str, Any] | None, replicas: int, pod_ips: Sequence[str] = ()
) -> list[str]:
    """Every draft's ``/v1/load``: the ``starsd.io/load-url`` annotation when set in ``annotations`` (a
    comma-separated list, one URL per draft), else the draft Service's address for one draft and each ready
    draft pod's own address (``pod_ips``, from the watched pods: :func:`naming.draft_pod_load_url`) for
    several; the caller passes ``None`` unless the operator allows the annotation."""
    url = (annotations or {}).get(c.ANNOTATION_LOAD_URL)
    if isinstance(url, str) and url.strip():
        return [u.strip() for u in url.split(",") if u.strip()]
    if replicas <= 1 or not pod_ips:
        return [naming.default_load_url(owner)]
    return [naming.draft_pod_load_url(ip) for ip in pod_ips]


@dataclass(frozen=True)
class DraftReadings:
    """One reading per draft URL: its load, or why it could not be read."""

    urls: tuple[str, ...]
    loads: tuple[Load | None, ...]
    errors: tuple[str | None, ...]

    @property
    def readable(self) -> list[Load]:
        return [x for x in self.loads if x is not None]

    def error(self) -> str:
        """Why no draft could be read (each draft's reason)."""
        return "; ".join(e for e in self.errors if e) or "no draft load URL"

    def aggregated(self) -> Load | None:
        """The readable drafts as one reading (:func:`rebalancer.aggregate`); one draft's reading as it is."""
        loads = self.readable
        if not loads:
            return None
        return loads[0] if len(self.urls) == 1 else aggregate(loads)


def read_all(urls: Sequence[str], read: Callable[[str], Load]) -> DraftReadings:
    """Read every URL with ``read`` (e.g. :func:`fetch`), in parallel; a failure is kept, not raised."""

    def one(url: str) -> tuple[Load | None, str | None]:
        try:
            return read(url), None
        except LoadUnavailable as exc:
            return None, str(exc)

    if len(urls) <= 1:
        results = [one(u) for u in urls]
    else:
        with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
            results = list(pool.map(one, urls))
    return DraftReadings(tuple(urls), tuple(r[0] for r in results), tuple(r[1] for r in results))


def fetch(url: str, timeout: float = DEFAULT_TIMEOUT) -> Load:
    """One reading of ``url``; raises :class:`LoadUnavailable` on any failure."""
    if not url.startswith(("http://", "https://")):
        raise LoadUnavailable(f"{url}: only http(s) load URLs are read")
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            body = response.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise LoadUnavailable(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise LoadUnavailable(f"{url}: {getattr(exc, 'reason', None) or exc}") from exc
    if len(body) > MAX_BODY:
        raise LoadUnavailable(f"{url}: response larger than {MAX_BODY} bytes")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise LoadUnavailable(f"{url}: not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise LoadUnavailable(f"{url}: expected a JSON object")
    try:
        return Load.from_json(data)
    except ValueError as exc:
        raise LoadUnavailable(f"{url}: {exc}") from exc
