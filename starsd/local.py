"""A star on this machine: one draft process and N target processes on loopback.

Used by ``starsd local``, ``starsd demo``, the benchmarks and the integration tests, so that they all run the
real servers the way Kubernetes does: one process each, talking gRPC and HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from starsd import defaults
from starsd.paths import models_dir


def default_models_dir() -> Path:
    """The shipped tokenizer and model pair (``$STARSD_MODELS_DIR`` overrides)."""
    return models_dir()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> tuple[int, Any]:
    """GET (or POST ``body``) and decode the JSON answer; returns (status, payload) for 4xx/5xx too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        payload = err.read()
        try:
            return err.code, json.loads(payload)
        except json.JSONDecodeError:
            return err.code, payload.decode(errors="replace")


class StartError(RuntimeError):
    """A process of the star did not come up; the message carries the end of its log."""


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - held open for the process's lifetime
        self.popen = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close_log(self) -> None:
        if self._log:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalStar:
    """One draft and ``targets`` targets as processes on loopback; a context manager that always cleans up."""

    draft_model: Path | None = None  # None with emulate_service_time
    target_model: Path | None = None
    targets: int = 4
    gamma: int = defaults.GAMMA
    host: str = "127.0.0.1"
    draft_args: list[str] = field(default_factory=list)
    target_args: list[str] = field(default_factory=list)
    emulate_service_time: float | None = None
    log_dir: Path | None = None
    threads: int = 1  # torch threads per process
    device: str = "auto"  # --device and --dtype of every process (see starsd.devices)
    dtype: str = "auto"

    def __post_init__(self) -> None:
        models = default_models_dir()
        if self.draft_model is None and self.emulate_service_time is None:
            self.draft_model = models / "draft"
        if self.target_model is None:
            self.target_model = models / "target"
        self._own_log_dir = self.log_dir is None
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="starsd-local-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)  # a --log-dir that does not exist yet is made
        self.draft_port = free_port(self.host)
        self.metrics_port = free_port(self.host)
        self.target_ports = [free_port(self.host) for _ in range(self.targets)]
        self.draft: Proc | None = None
        self.target_procs: list[Proc] = []

    # --- addresses -------------------------------------------------------------------------------------

    @property
    def draft_address(self) -> str:
        return f"{self.host}:{self.draft_port}"

    @property
    def load_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/v1/load"

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.target_ports]

    # --- lifecycle -------------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(STARSD_TORCH_THREADS=str(self.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _draft_proc(self) -> Proc:
        argv = [sys.executable, "-m", "starsd.cli", "draft", "--host", self.host, "--port", str(self.draft_port)]
        argv += ["--metrics-port", str(self.metrics_port)]
        if self.emulate_service_time is not None:
            argv += ["--emulate-service-time", str(self.emulate_service_time)]
        else:
            argv += ["--model", str(self.draft_model), "--device", self.device, "--dtype", self.dtype]
        assert self.log_dir is not None
        return Proc("draft", argv + self.draft_args, self.log_dir / "draft.log")

    def _target_proc(self, i: int, port: int) -> Proc:
        argv = [sys.executable, "-m", "starsd.cli", "target", "--model", str(self.target_model)]
        argv += ["--draft", self.draft_address, "--host", self.host, "--port", str(port)]
        argv += ["--gamma", str(self.gamma), "--id", f"target-{i}", "--device", self.device, "--dtype", self.dtype]
        assert self.log_dir is not None
        return Proc(f"target-{i}", argv + self.target_args, self.log_dir / f"target-{i}.log")

    def start(self, timeout: float = 300.0, wait_draft_link: bool = True) -> LocalStar:
        """Start every process at once and wait until each is ready (and each target reached the draft)."""
        env = self._env()
        self.draft = self._draft_proc()
        self.draft.start(env)
        self.target_procs = [self._target_proc(i, p) for i, p in enumerate(self.target_ports)]
        for proc in self.target_procs:
            proc.start(env)
        try:
            deadline = time.monotonic() + timeout
            self._wait_ready(self.draft, f"http://{self.host}:{self.metrics_port}/readyz", deadline)
            for proc, url in zip(self.target_procs, self.urls, strict=True):
                self._wait_ready(proc, f"{url}/readyz", deadline, need_draft=wait_draft_link)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: Proc, url: str, deadline: float, need_draft: bool = False) -> None:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise StartError(f"{proc.name} exited during start-up; its log ends with:\n{proc.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                status, body = http_json(url, timeout=2.0)
                if status == 200 and (not need_draft or body.get("draft_connected")):
                    return
                if need_draft and body.get("draft_incompatible"):  # waiting longer cannot help
                    raise StartError(f"{proc.name} cannot use the draft: {body.get('draft_error')}")
            time.sleep(0.2)
        raise StartError(f"{proc.name} was not ready in time ({url}); its log ends with:\n{proc.log_tail()}")

    def kill_draft(self, sig: int = signal.SIGKILL) -> None:
        if self.draft:
            self.draft.signal(sig)
            self.draft.wait(10)
            self.draft.close_log()

    def restart_draft(self, timeout: float = 120.0) -> None:
        """Start the draft again on the same ports (after :meth:`kill_draft`)."""
        self.draft = self._draft_proc()
        self.draft.start(self._env())
        self._wait_ready(self.draft, f"http://{self.host}:{self.metrics_port}/readyz", time.monotonic() + timeout)

    def wait_linked(self, timeout: float = 120.0) -> None:
        """Wait until every target is connected to the draft again (after :meth:`restart_draft`)."""
        deadline = time.monotonic() + timeout
        for proc, url in zip(self.target_procs, self.urls, strict=True):
            self._wait_ready(proc, f"{url}/readyz", deadline, need_draft=True)

    def stop(self, grace: float = 10.0) -> None:
        procs = [p for p in [*self.target_procs, self.draft] if p is not None]
        for proc in procs:
            proc.signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for proc in procs:
            if proc.wait(max(0.1, end - time.monotonic())) is None:
                proc.signal(signal.SIGKILL)
                proc.wait(5)
            proc.close_log()

    def __enter__(self) -> LocalStar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
