"""Reading several drafts' /v1/load over HTTP, one real server on loopback per draft, and their aggregate."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from starsd_operator import draftcount, loadclient, naming
from starsd_operator.naming import Owner
from starsd_operator.rebalancer import Decision


def body(util: float, targets: int, waiting: int) -> bytes:
    return json.dumps(
        {
            "utilization": util,
            "window_seconds": 10.0,
            "tq_seconds": 0.004,
            "tp_seconds": 0.02,
            "tc_seconds": 0.001,
            "queue_depth": 1,
            "targets": targets,
            "regime": "FullyLoaded",
            "active_sessions": targets,
            "recommended_targets": 7,
            "waiting_requests": waiting,
            "target_occupancy": 0.5,
        }
    ).encode()


def serve(payload: bytes, code: int = 200) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1/load"


@pytest.fixture
def drafts() -> Iterator[list[str]]:
    servers = [serve(body(0.5, 3, 0)), serve(body(0.92, 4, 2)), serve(b"{}", code=503)]
    yield [url for _, url in servers]
    for server, _ in servers:
        server.shutdown()
        server.server_close()


OWNER = Owner("chat", "ml", "uid-1")


def test_the_annotation_holds_one_url_per_draft() -> None:
    urls = loadclient.load_urls(OWNER, {"starsd.io/load-url": " http://a/v1/load, http://b/v1/load ,"}, 5)
    assert urls == ["http://a/v1/load", "http://b/v1/load"]
    # Several drafts: each ready draft pod by its address (IPv6 in brackets); none ready yet: the Service.
    assert loadclient.load_urls(OWNER, None, 3, ["10.0.0.5", "fd00::7"]) == [
        "http://10.0.0.5:9090/v1/load",
        "http://[fd00::7]:9090/v1/load",
    ]
    assert loadclient.load_urls(OWNER, None, 3) == [naming.default_load_url(OWNER)]
    assert loadclient.load_urls(OWNER, None, 1, ["10.0.0.5"]) == [naming.default_load_url(OWNER)]


def test_every_draft_is_read_and_aggregated(drafts: list[str]) -> None:
    readings = loadclient.read_all(drafts, loadclient.fetch)
    assert readings.urls == tuple(drafts)
    assert [x is None for x in readings.loads] == [False, False, True]
    assert readings.errors[2] is not None and "HTTP 503" in readings.errors[2]
    agg = readings.aggregated()
    assert agg is not None
    assert agg.utilization == 0.92  # the worst draft
    assert (agg.targets, agg.waiting_requests, agg.queue_depth) == (7, 2, 2.0)  # total demand
    assert agg.optimal_targets() == 14
    assert len(agg.per_draft) == 2


def test_status_shows_the_worst_draft_and_each_drafts_load(drafts: list[str]) -> None:
    readings = loadclient.read_all(drafts, loadclient.fetch)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    decision = Decision(3, 2, "DraftsSaturated", "2 -> 3 drafts: every draft saturated")
    out = draftcount.status(readings, decision, {}, now)["drafts"]
    assert out["worstUtilization"] == 0.92
    assert [row["index"] for row in out["loads"]] == [0, 1, 2]
    assert out["loads"][1]["utilization"] == 0.92 and out["loads"][1]["connectedTargets"] == 4
    assert "HTTP 503" in out["loads"][2]["error"]
    assert out["lastRebalance"]["from"] == 2 and out["lastRebalance"]["to"] == 3
    assert out["lastRebalance"]["reason"] == "DraftsSaturated"
    # A holding decision keeps the last change; it seeds the rate limits after a restart.
    kept = draftcount.status(readings, Decision(3, 3, "Balanced", "hold"), {"drafts": out}, now)["drafts"]
    assert kept["lastRebalance"] == out["lastRebalance"]
    [change] = draftcount.last_change({"drafts": kept})
    assert (change.previous, change.replicas, change.at) == (2, 3, now.timestamp())


def test_no_draft_readable_says_why_for_each(drafts: list[str]) -> None:
    readings = loadclient.read_all([drafts[2], "ftp://nowhere/v1/load"], loadclient.fetch)
    assert readings.aggregated() is None
    assert "HTTP 503" in readings.error() and "only http(s)" in readings.error()
