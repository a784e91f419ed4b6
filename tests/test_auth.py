"""API keys of the target (starsd.openai_api.auth): which keys load, which requests pass, how a refusal reads.
The real server with the real ``openai`` client is in tests/integration/test_api_keys.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Counter

from starsd.openai_api import auth

KEY = "sk-test-0123456789abcdef"
OTHER = "sk-other-fedcba9876543210"


def test_keys_come_from_flags_files_and_the_environment_each_once(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# rotated 2026-12\n{OTHER}\n\n  {KEY}  \n")
    keys = auth.load_keys([KEY], [keys_file], {auth.ENV_API_KEY: "sk-env-1,sk-env-2"})
    assert keys == [KEY, OTHER, "sk-env-1", "sk-env-2"]


def test_no_key_anywhere_is_no_key() -> None:
    assert auth.load_keys(None, None, {}) == []


@pytest.mark.parametrize(
    ("flags", "env", "complaint"),
    [
        (["sk bad key"], {}, "API key 1 from --api-key is not usable"),
        ([], {auth.ENV_API_KEY: ""}, "$STARSD_API_KEY is set but holds no key"),
        ([], {auth.ENV_API_KEY: " , ,"}, "$STARSD_API_KEY is set but holds no key"),
        ([], {auth.ENV_API_KEY: "sk-ok,sk-\u00e9t\u00e9"}, "API key 2 from $STARSD_API_KEY is not usable"),
    ],
)
def test_unusable_keys_are_refused_without_showing_them(flags: list[str], env: dict[str, str], complaint: str) -> None:
    with pytest.raises(auth.ApiKeyError) as caught:
        auth.load_keys(flags, None, env)
    assert complaint in str(caught.value)
    for key in [*flags, *env.values()]:
        for part in key.split(","):
            if part.strip():
                assert part.strip() not in str(caught.value)


def test_a_key_file_that_cannot_be_read_or_holds_no_key_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(auth.ApiKeyError, match="holds no key"):
        auth.load_keys(None, [empty], {})
    with pytest.raises(auth.ApiKeyError, match="cannot be read"):
        auth.load_keys(None, [tmp_path / "missing"], {})


@pytest.mark.parametrize(
    ("header", "verdict"),
    [
        (f"Bearer {KEY}", None),
        (f"bearer {OTHER}", None),
        (f"  Bearer   {KEY}  ", None),
        (None, auth.MISSING),
        ("", auth.MISSING),
        ("Bearer", auth.MISSING),
        ("Bearer ", auth.MISSING),
        (f"Basic {KEY}", auth.MISSING),
        (KEY, auth.MISSING),
        ("Bearer sk-wrong", auth.INVALID),
        (f"Bearer {KEY}x", auth.INVALID),
        (f"Bearer {KEY[:-1]}", auth.INVALID),
    ],
)
def test_only_a_bearer_header_with_an_accepted_key_passes(header: str | None, verdict: str | None) -> None:
    assert auth.KeyRing([KEY, OTHER]).check(header) == verdict


def test_a_key_ring_shows_how_many_keys_never_which() -> None:
    ring = auth.KeyRing([KEY, OTHER])
    assert len(ring) == 2
    assert KEY not in repr(ring) and "2 keys" in repr(ring)


async def _ok(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


Call = tuple[str, str, dict[str, str]]  # (method, path, headers)


def _serve(calls: list[Call]) -> tuple[list[tuple[int, dict[str, str], dict[str, object]]], Counter]:
    """Send ``calls`` byte for byte (paths as written, not normalised by a client) to a small app with the
    target's route names behind the middleware; returns each answer's (status, headers, JSON body) and the
    refusal counter."""
    refused = Counter("refused", "refusals", ["reason"], registry=CollectorRegistry())

    async def send(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close", "Content-Length: 0"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = await reader.read()
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode().split("\r\n")
        parsed = dict(line.split(": ", 1) for line in header_lines)
        return int(status_line.split()[1]), parsed, json.loads(body)

    async def main() -> list[tuple[int, dict[str, str], Any]]:
        app = web.Application(middlewares=[auth.middleware(auth.KeyRing([KEY]), refused)])
        for path in ("/health", "/healthz", "/readyz", "/metrics", "/version", "/drain", "/v1/models", "/tokenize"):
            app.router.add_get(path, _ok)
        app.router.add_post("/v1/completions", _ok)
        app.router.add_get("/v1/models/{model}", _ok)
        async with TestServer(app) as server:
            assert server.port is not None
            return [await send(server.port, *call) for call in calls]

    return asyncio.run(main()), refused


@pytest.mark.parametrize("path", ["/health", "/healthz", "/readyz", "/metrics", "/version", "/drain"])
def test_probe_and_scrape_routes_stay_open(path: str) -> None:
    [(status, _, _)], _ = _serve([("GET", path, {})])
    assert status == 200


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models",
        "/v1/models/anything",
        "/tokenize",
        "/no/such/route",
        "/metrics/../v1/models",
        "//v1/models",
        "/v1/models/",
        "/V1/models",
        "/%761/models",
        "/v1/models?x=/metrics",
        "http://localhost/v1/models",
    ],
)
def test_every_other_path_needs_the_key(path: str) -> None:
    [(status, headers, body)], refused = _serve([("GET", path, {"X-Forwarded-Prefix": "/metrics"})])
    assert status == 401
    assert headers["WWW-Authenticate"] == "Bearer"
    error = body["error"]
    assert isinstance(error, dict)
    assert body == {
        "error": {
            "message": error["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert refused.labels(reason=auth.MISSING)._value.get() == 1


def test_the_right_key_passes_and_a_wrong_one_is_counted_apart() -> None:
    answers, refused = _serve(
        [
            ("POST", "/v1/completions", {"Authorization": f"Bearer {KEY}"}),
            ("POST", "/v1/completions", {"Authorization": "Bearer sk-nope"}),
        ]
    )
    assert [a[0] for a in answers] == [200, 401]
    error = answers[1][2]["error"]
    assert isinstance(error, dict) and "not valid" in str(error["message"])
    assert refused.labels(reason=auth.INVALID)._value.get() == 1
    assert refused.labels(reason=auth.MISSING)._value.get() == 0


@pytest.mark.parametrize("command", [["local"], ["target", "--model", "/nonexistent"]])
def test_the_commands_refuse_unusable_keys_before_starting_anything(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from starsd.cli import main

    monkeypatch.setenv(auth.ENV_API_KEY, "")
    assert main([*command, "--api-key", KEY]) == 2
    err = capsys.readouterr().err
    assert "$STARSD_API_KEY is set but holds no key" in err and KEY not in err
    monkeypatch.delenv(auth.ENV_API_KEY)
    assert main([*command, "--api-key", f"{KEY} trailing-part"]) == 2
    err = capsys.readouterr().err
    assert "API key 1 from --api-key is not usable" in err and "trailing-part" not in err
