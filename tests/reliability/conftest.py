"""Shared pieces of the reliability tests: the model pair, the oracle, a star whose draft link runs through a
fault proxy, and probes of the draft process (memory, sessions, load).

The star is shared by this package's tests (each server process costs seconds of CPU to start on this machine);
every test that breaks it puts it back (``healthy_star`` checks), so the tests can run in any order and alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from starsd import procfs
from starsd.checkpoints import load_checkpoint
from starsd.local import LocalStar, Proc, default_models_dir, free_port, http_json
from tests.integration.conftest import PROMPTS, Reference
from tests.support.faults import ThreadedFaultProxy

SOAK = os.environ.get("STARSD_SOAK") == "1"
DRAFT_TIMEOUT = 1.0  # the star's targets: --draft-timeout (seconds a round waits for the draft)
START_TIMEOUT = 600.0  # server start-up on a busy 2-core machine takes long; it is not what is measured

soak_only = pytest.mark.skipif(not SOAK, reason="a long variant: run with `make soak` (STARSD_SOAK=1)")


@pytest.fixture(scope="session")
def pair(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """The shipped (draft, target) pair when it is there, else the tiny random pair: what is tested here is the
    servers' behaviour under load and faults, which does not depend on how good the models are."""
    root = default_models_dir()
    if all((root / name / "config.json").is_file() for name in ("draft", "target")):
        return root / "draft", root / "target"
    random_pair: tuple[Path, Path] = request.getfixturevalue("random_pair")
    return random_pair


@pytest.fixture(scope="package")
def oracle(pair: tuple[Path, Path]) -> Reference:
    """The target alone (no draft, no server): greedy output must equal it token for token."""
    return Reference(load_checkpoint(pair[1]))


def long_greedy_prompts(oracle: Reference, n: int, max_tokens: int) -> list[str | list[int]]:
    """Prompts whose greedy output runs the full ``max_tokens`` (no early end of sequence)."""
    found = [p for p in PROMPTS if len(oracle.greedy(p, max_tokens)) == max_tokens]
    assert found, "no prompt generates without an early end of sequence"
    return [found[i % len(found)] for i in range(n)]


# --- probes of the draft ------------------------------------------------------------------------------------


def draft_rss_bytes(star: LocalStar) -> int:
    """Resident memory of the draft: its server process and its model process."""
    assert star.draft is not None and star.draft.popen is not None
    rss = procfs.rss_bytes(star.draft.popen.pid)
    assert rss is not None, "the draft process is gone"
    return rss


def draft_metrics(star: LocalStar) -> dict[str, float]:
    """The draft's Prometheus samples without labels, by name."""
    url = f"http://{star.host}:{star.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


def draft_sessions(star: LocalStar) -> int:
    return int(draft_metrics(star)["starsd_draft_sessions"])


def draft_load(star: LocalStar) -> dict[str, Any]:
    status, body = http_json(star.load_url, timeout=10)
    assert status == 200, body
    return dict(body)


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> float:
    """Poll ``check`` until it holds; returns the seconds it took, fails the test with ``what`` otherwise."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(interval)


def wait_sessions_freed(star: LocalStar, timeout: float = 30.0) -> float:
    """The sessions gauge and /v1/load's active sessions are back to 0 (well before the 300 s idle sweep)."""
    window = float(draft_load(star)["window_seconds"])
    return wait_for(
        lambda: draft_sessions(star) == 0 and draft_load(star)["active_sessions"] == 0,
        timeout + window,
        "the draft's sessions to be freed (starsd_draft_sessions and /v1/load active_sessions at 0)",
    )


def linked(url: str) -> bool:
    status, body = http_json(f"{url}/readyz", timeout=5)
    return status == 200 and bool(body.get("draft_connected"))


def wait_linked(urls: list[str], timeout: float = 120.0) -> float:
    return wait_for(lambda: all(linked(u) for u in urls), timeout, f"targets {urls} to reach the draft")


# --- extra target processes ------------------------------------------------------------------------------


@dataclass
class Target:
    """A target process started on its own (options the star's targets do not share)."""

    proc: Proc
    url: str

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.signal(sig)
        self.proc.wait(15)
        self.proc.close_log()

    def stop(self) -> None:
        self.proc.signal(signal.SIGTERM)
        if self.proc.wait(15) is None:
            self.kill()
        self.proc.close_log()


def start_target(
    model: Path, draft: str, name: str, log_dir: Path, args: list[str] | None = None, need_draft: bool = True
) -> Target:
    port = free_port()
    argv = [sys.executable, "-m", "starsd.cli", "target", "--model", str(model), "--draft", draft]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--id", name, *(args or [])]
    proc = Proc(name, argv, log_dir / f"{name}.log")
    env = dict(os.environ, STARSD_TORCH_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc.start(env)
    target = Target(proc, f"http://127.0.0.1:{port}")

    def ready() -> bool:
        if not proc.alive():
            raise AssertionError(f"{name} exited during start-up; its log ends with:\n{proc.log_tail()}")
        status, body = http_json(f"{target.url}/readyz", timeout=5)
        return status == 200 and (not need_draft or bool(body.get("draft_connected")))

    try:
        wait_for(ready, START_TIMEOUT, f"{name} to be ready")
    except BaseException:
        target.kill()
        raise
    return target


# --- the shared star ------------------------------------------------------------------------------------


@dataclass
class ProxiedStar:
    """One draft and three targets whose draft link runs through a fault proxy."""

    star: LocalStar
    proxy: ThreadedFaultProxy
    pair: tuple[Path, Path]
    log_dir: Path

    @property
    def urls(self) -> list[str]:
        return self.star.urls


@pytest.fixture(scope="package")  # torn down when this package's tests are done, not at the end of the run
def proxied_star(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxiedStar]:
    log_dir = tmp_path_factory.mktemp("reliability-star")
    star = LocalStar(draft_model=pair[0], target_model=pair[1], targets=3, log_dir=log_dir)
    proxy = ThreadedFaultProxy("127.0.0.1", star.draft_port).start()
    star.target_args = ["--draft", proxy.address, "--draft-timeout", str(DRAFT_TIMEOUT)]
    try:
        star.start(timeout=START_TIMEOUT)
        yield ProxiedStar(star, proxy, pair, log_dir)
    finally:
        star.stop()
        proxy.stop()


def make_healthy(proxied_star: ProxiedStar) -> ProxiedStar:
    """Put the shared star back as a test expects to find it: draft up, plain link, every target linked."""
    star = proxied_star.star
    proxied_star.proxy.set_delay(0.0)
    proxied_star.proxy.set_refusing(False)
    if star.draft is None or not star.draft.alive():
        star.restart_draft(timeout=START_TIMEOUT)
    dead = [p.name for p in star.target_procs if not p.alive()]
    assert not dead, f"targets of the shared star died: {dead}"
    wait_linked(star.urls)
    return proxied_star


@pytest.fixture
def healthy_star(proxied_star: ProxiedStar) -> ProxiedStar:
    return make_healthy(proxied_star)
