"""A local star whose port another process takes before its server binds it starts again on new ports.

Ports are chosen before the processes start, so on a busy machine another process (or an outgoing connection)
can take one first; the tests, the demo and the benchmarks must not fail on that."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from starsd.local import LocalStar, PortTaken, free_port, http_json


@contextmanager
def listening_on(port: int) -> Iterator[None]:
    """Another process's server on ``port`` (as far as the star can tell)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def test_free_port_gives_distinct_bindable_ports() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:
        with listening_on(port):
            pass


@pytest.mark.parametrize("taken", ["target", "draft", "metrics"])
def test_a_star_whose_port_was_taken_starts_on_new_ports(
    taken: str, shipped_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    star = LocalStar(draft_model=shipped_pair[0], target_model=shipped_pair[1], targets=1, log_dir=tmp_path)
    port = {"target": star.target_ports, "draft": star.draft_ports, "metrics": star.metrics_ports}[taken][0]
    with listening_on(port):
        star.start()
        try:
            assert port not in [*star.target_ports, *star.draft_ports, *star.metrics_ports]
            status, body = http_json(f"{star.urls[0]}/readyz")
            assert status == 200 and body["draft_connected"]
        finally:
            star.stop()


def test_a_port_taken_on_every_attempt_is_reported(shipped_pair: tuple[Path, Path], tmp_path: Path) -> None:
    star = LocalStar(draft_model=shipped_pair[0], target_model=shipped_pair[1], targets=1, log_dir=tmp_path)
    with listening_on(star.target_ports[0]), pytest.raises(PortTaken, match="target-0 exited during start-up"):
        star.start(attempts=1)
