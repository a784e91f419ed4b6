"""API keys on the target's OpenAI routes: which keys are accepted, and how a refusal reads.

A target started with keys (``--api-key``, ``--api-key-file``, ``$STARSD_API_KEY``) answers a request only
when it carries ``Authorization: Bearer KEY`` with one of them; anything else gets 401 in OpenAI's error shape
(``code: invalid_api_key``), and is counted in ``starsd_target_unauthorized_requests_total``. Without keys
nothing changes.

What stays open is what an orchestrator and a scraper need, as vLLM leaves them open: ``/health``,
``/healthz``, ``/readyz``, ``/metrics``, ``/version``, and ``/drain`` (which answers only on loopback, see
:mod:`starsd.openai_api.drain`). Every other route needs the key, ``/tokenize`` and ``/detokenize`` included
(vLLM leaves those two open; they run the tokenizer on the caller's text). The decision is made on the route
the router matched, never on a prefix of the path, and a path that matches no route needs the key too: a
crafted path cannot reach an OpenAI route without it.

Keys are kept only as SHA-256 digests, compared with :func:`hmac.compare_digest` against every accepted key
(fixed-length digests, no early exit), and never written to a log or an error message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import Counter

from starsd import defaults
from starsd.verifier.metrics import UNAUTHORIZED_REASONS

ENV_API_KEY = defaults.API_KEY_ENV
OPEN_PATHS = frozenset({"/health", "/healthz", "/readyz", "/metrics", "/version", "/drain"})

# Why a request was refused (the label of the refusal counter).
MISSING, INVALID = UNAUTHORIZED_REASONS


class ApiKeyError(ValueError):
    """Keys that cannot be used; the message names where they came from, never a key."""


def parse_keys(text: str, source: str) -> list[str]:
    """The keys in ``text``: one per line or comma-separated; blank lines and lines starting with ``#`` are
    skipped. A key is visible ASCII (no spaces, no commas), as a Bearer token is."""
    keys: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        for part in line.split(","):
            key = part.strip()
            if key:
                check_key(key, source, len(keys) + 1)
                keys.append(key)
    return keys


def check_key(key: str, source: str, ordinal: int) -> None:
    """Refuse a key a client could not send as ``Authorization: Bearer KEY`` (the message never shows it)."""
    if not key or not all("!" <= ch <= "~" and ch != "," for ch in key):
        raise ApiKeyError(
            f"API key {ordinal} from {source} is not usable: a key is visible ASCII characters, "
            "without spaces or commas"
        )


def load_keys(flags: Sequence[str] | None, files: Sequence[Path] | None, env: Mapping[str, str]) -> list[str]:
    """Every key of ``--api-key`` (``flags``), ``--api-key-file`` (``files``) and ``$STARSD_API_KEY``.

    A file that cannot be read or holds no key, and ``$STARSD_API_KEY`` set but holding no key, are errors:
    a server meant to need a key must not start open because its key came out empty."""
    keys: list[str] = []
    for i, flag in enumerate(flags or (), start=1):
        check_key(flag.strip(), "--api-key", i)
        keys.append(flag.strip())
    for path in files or ():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiKeyError(f"--api-key-file {path}: cannot be read ({type(exc).__name__})") from None
        found = parse_keys(text, f"--api-key-file {path}")
        if not found:
            raise ApiKeyError(f"--api-key-file {path} holds no key (one per line; '#' starts a comment)")
        keys += found
    if ENV_API_KEY in env:
        found = parse_keys(env[ENV_API_KEY], f"${ENV_API_KEY}")
        if not found:
            raise ApiKeyError(f"${ENV_API_KEY} is set but holds no key; unset it to serve without keys")
        keys += found
    return list(dict.fromkeys(keys))  # each once, in order


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The accepted keys, as digests only (so neither a repr nor a traceback can show one)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._digests = tuple(_digest(k) for k in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"KeyRing({len(self._digests)} keys)"

    def check(self, authorization: str | None) -> str | None:
        """None when ``authorization`` (the header's value) carries an accepted key, else why not
        (:data:`MISSING` or :data:`INVALID`)."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return MISSING
        offered = _digest(token)
        match = False
        for digest in self._digests:  # every key is compared, whichever matches
            match |= hmac.compare_digest(offered, digest)
        return None if match else INVALID


def is_open(request: web.Request) -> bool:
    """Whether the route ``request`` matched is one that stays open (a path matching no route is not)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical in OPEN_PATHS


def refusal(reason: str) -> web.Response:
    """The 401 answer, in OpenAI's error shape."""
    if reason == MISSING:
        message = "this server needs an API key: send it as the header 'Authorization: Bearer KEY'"
    else:
        message = "the API key sent is not valid for this server"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    return web.json_response({"error": error}, status=401, headers={"WWW-Authenticate": "Bearer"})


def middleware(keys: KeyRing, refused: Counter) -> Middleware:
    """An aiohttp middleware that lets through open routes and requests with an accepted key, and answers
    every other request 401 (counted in ``refused``, labelled by reason)."""

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_open(request):
            return await handler(request)
        reason = keys.check(request.headers.get("Authorization"))
        if reason is not None:
            refused.labels(reason=reason).inc()
            return refusal(reason)
        return await handler(request)

    return require_key
