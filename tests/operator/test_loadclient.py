"""Reading /v1/load over HTTP from a real server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from starsd_operator import loadclient
from starsd_operator.loadclient import LoadUnavailable, fetch, load_url

from . import factories as f

GOOD = {
    "utilization": 0.5,
    "window_seconds": 10.0,
    "tq_seconds": 0.004,
    "tp_seconds": 0.02,
    "tc_seconds": 0.001,
    "queue_depth": 0,
    "targets": 2,
    "regime": "UnderLoaded",
    "active_sessions": 6,
    "recommended_targets": 7,
}


class Draft(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, bytes]]] = {}

    def do_GET(self) -> None:
        code, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(code)
        if 300 <= code < 400:
            self.send_header("Location", body.decode())  # a redirect's body here is where it points
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def draft() -> Iterator[str]:
    Draft.routes.clear()
    Draft.routes.update(
        {
            "/v1/load": (200, json.dumps(GOOD).encode()),
            "/bad-json": (200, b"{not json"),
            "/list": (200, b"[1, 2]"),
            "/bad-field": (200, json.dumps({**GOOD, "utilization": "high"}).encode()),
            "/huge": (200, b" " * (loadclient.MAX_BODY + 10)),
            "/error": (503, b"{}"),
            "/redirect": (302, b"/v1/load"),
        }
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Draft)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_reads_the_load(draft: str) -> None:
    load = fetch(f"{draft}/v1/load")
    assert load.utilization == 0.5 and load.recommended_targets == 7 and load.active_sessions == 6
    assert not load.empty


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/bad-json", "not JSON"),
        ("/list", "JSON object"),
        ("/bad-field", "utilization"),
        ("/huge", "larger than"),
        ("/error", "503"),
        ("/missing", "404"),
        ("/redirect", "302 redirect to http://127.0.0.1:[0-9]+/v1/load refused"),
    ],
)
def test_bad_answers_are_load_unavailable(draft: str, path: str, says: str) -> None:
    with pytest.raises(LoadUnavailable, match=says):
        fetch(f"{draft}{path}")


def test_an_unreachable_draft_is_load_unavailable() -> None:
    with pytest.raises(LoadUnavailable, match=r"127\.0\.0\.1:9"):
        fetch("http://127.0.0.1:9/v1/load", timeout=1)
    with pytest.raises(LoadUnavailable, match="only http"):
        fetch("file:///etc/passwd")


def test_the_annotation_overrides_the_service_address() -> None:
    assert load_url(f.OWNER, {}) == "http://chat-draft.ml.svc:9090/v1/load"
    assert load_url(f.OWNER, {"starsd.io/load-url": " http://127.0.0.1:5/v1/load "}) == "http://127.0.0.1:5/v1/load"
    assert load_url(f.OWNER, {"starsd.io/load-url": ""}) == "http://chat-draft.ml.svc:9090/v1/load"
