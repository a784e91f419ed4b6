"""A star on this machine: one draft process (or several) and N target processes on loopback.

Used by ``starsd local``, ``starsd demo``, the benchmarks and the integration tests, so that they all run the
real servers the way Kubernetes does: one process each, talking gRPC and HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
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


_handed_out: set[int] = set()  # ports this process gave away already (a server may not have bound one yet)


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux; its default elsewhere)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server started later.

    Chosen below the kernel's ephemeral range when there is room: a port from that range can be taken by any
    outgoing connection between now and the server's bind, which on a busy machine happens. Never the same port
    twice in one process. A bind can still lose a race with another process: :class:`LocalStar` starts again
    on new ports when one of its servers finds its port taken."""
    low, _ = _ephemeral_range()
    candidates = [random.randrange(10_000, low) for _ in range(64)] if low > 11_000 else []
    for port in [*candidates, 0]:
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            chosen = int(s.getsockname()[1])
        if chosen not in _handed_out:
            _handed_out.add(chosen)
            return chosen
    raise OSError(f"no free port on {host}")


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


class PortTaken(StartError):
    """A process of the star exited because another process had taken its port first."""


# What the draft (gRPC), the targets and the metrics servers (aiohttp) print when their port is taken.
_PORT_TAKEN_MARKS = ("address already in use", "port in use")


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    _log_start: int = 0  # where this run's lines begin in the log (a restart appends to it)

    def start(self, env: dict[str, str]) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - held open for the process's lifetime
        self._log_start = self._log.tell()
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
        """The last ``lines`` lines this run of the process wrote."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class LocalStar:
    """``drafts`` drafts and ``targets`` targets as processes on loopback; a context manager that always cleans up.

    With several drafts every target is given the whole list (draft 0 first), as the operator does, and picks its
    own draft from its ordinal (see :mod:`starsd.assignment`)."""

    draft_model: Path | None = None  # None with emulate_service_time
    target_model: Path | None = None
    targets: int = 4
    drafts: int = 1
    gamma: int = defaults.GAMMA
    host: str = "127.0.0.1"
    draft_args: list[str] = field(default_factory=list)
    target_args: list[str] = field(default_factory=list)
    emulate_service_time: float | None = None
    log_dir: Path | None = None
    threads: int = 1  # torch threads per process
    device: str = "auto"  # --device and --dtype of every process (see starsd.devices)
    dtype: str = "auto"
    # Keys the targets accept (starsd.openai_api.auth), handed over in their environment, never their argv;
    # empty: open targets, whatever $STARSD_API_KEY this process has.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    log_level: str | None = None  # every process's --log-level (None: the default, INFO)
    cuda_graphs: str = "auto"  # the draft's --cuda-graphs

    def __post_init__(self) -> None:
        if self.drafts < 1:
            raise ValueError(f"a star needs at least one draft, got drafts={self.drafts}")
        models = default_models_dir()
        if self.draft_model is None and self.emulate_service_time is None:
            self.draft_model = models / "draft"
        if self.target_model is None:
            self.target_model = models / "target"
        self._own_log_dir = self.log_dir is None
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="starsd-local-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)  # a --log-dir that does not exist yet is made
        self._choose_ports()
        self.draft_procs: list[Proc | None] = [None] * self.drafts
        self.target_procs: list[Proc] = []

    def _choose_ports(self) -> None:
        self.draft_ports = [free_port(self.host) for _ in range(self.drafts)]
        self.metrics_ports = [free_port(self.host) for _ in range(self.drafts)]
        self.draft_port, self.metrics_port = self.draft_ports[0], self.metrics_ports[0]  # draft 0's
        self.target_ports = [free_port(self.host) for _ in range(self.targets)]

    # --- addresses -------------------------------------------------------------------------------------

    @property
    def draft(self) -> Proc | None:
        """Draft 0's process."""
        return self.draft_procs[0]

    @property
    def draft_address(self) -> str:
        """Draft 0's gRPC address."""
        return self.draft_addresses[0]

    @property
    def draft_addresses(self) -> list[str]:
        return [f"{self.host}:{p}" for p in self.draft_ports]

    @property
    def load_url(self) -> str:
        """Draft 0's ``/v1/load``."""
        return self.load_urls[0]

    @property
    def load_urls(self) -> list[str]:
        return [f"http://{self.host}:{p}/v1/load" for p in self.metrics_ports]

    def _draft_ready_url(self, i: int) -> str:
        return f"http://{self.host}:{self.metrics_ports[i]}/readyz"

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.target_ports]

    # --- lifecycle -------------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(STARSD_TORCH_THREADS=str(self.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.pop(defaults.API_KEY_ENV, None)  # only the keys given here (the demo and benchmarks call without one)
        return env

    def _target_env(self) -> dict[str, str]:
        env = self._env()
        if self.api_keys:
            env[defaults.API_KEY_ENV] = ",".join(self.api_keys)
        return env

    def _cli(self) -> list[str]:
        """The interpreter and ``starsd`` with the options that precede the command."""
        argv = [sys.executable, "-m", "starsd.cli"]
        return argv + (["--log-level", self.log_level] if self.log_level else [])

    def _draft_proc(self, i: int = 0) -> Proc:
        argv = [*self._cli(), "draft", "--host", self.host, "--port", str(self.draft_ports[i])]
        argv += ["--metrics-port", str(self.metrics_ports[i])]
        if self.emulate_service_time is not None:
            argv += ["--emulate-service-time", str(self.emulate_service_time)]
        else:
            argv += ["--model", str(self.draft_model), "--device", self.device, "--dtype", self.dtype]
            argv += ["--cuda-graphs", self.cuda_graphs]
        assert self.log_dir is not None
        name = "draft" if self.drafts == 1 else f"draft-{i}"
        return Proc(name, argv + self.draft_args, self.log_dir / f"{name}.log")

    def _target_proc(self, i: int, port: int) -> Proc:
        argv = [*self._cli(), "target", "--model", str(self.target_model)]
        argv += ["--draft", ",".join(self.draft_addresses), "--host", self.host, "--port", str(port)]
        argv += ["--gamma", str(self.gamma), "--id", f"target-{i}", "--device", self.device, "--dtype", self.dtype]
        assert self.log_dir is not None
        return Proc(f"target-{i}", argv + self.target_args, self.log_dir / f"target-{i}.log")

    def start(self, timeout: float = 300.0, wait_draft_link: bool = True, attempts: int = 3) -> LocalStar:
        """Start every process at once and wait until each is ready (and each target reached the draft).

        A process whose port another process took in the meantime makes the whole star start again on new
        ports (the targets carry the drafts' addresses), at most ``attempts`` times in all."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout, wait_draft_link)
            except PortTaken:
                if attempt == attempts:
                    raise
                self._choose_ports()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float, wait_draft_link: bool) -> LocalStar:
        env = self._env()
        self.draft_procs = [self._draft_proc(i) for i in range(self.drafts)]
        for draft in self.draft_procs:
            assert draft is not None
            draft.start(env)
        self.target_procs = [self._target_proc(i, p) for i, p in enumerate(self.target_ports)]
        target_env = self._target_env()
        for proc in self.target_procs:
            proc.start(target_env)
        try:
            deadline = time.monotonic() + timeout
            for i, draft in enumerate(self.draft_procs):
                assert draft is not None
                self._wait_ready(draft, self._draft_ready_url(i), deadline)
            for proc, url in zip(self.target_procs, self.urls, strict=True):
                self._wait_ready(proc, f"{url}/readyz", deadline, need_draft=wait_draft_link)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: Proc, url: str, deadline: float, need_draft: bool = False) -> None:
        while time.monotonic() < deadline:
            if not proc.alive():
                tail = proc.log_tail()
                taken = any(mark in tail.lower() for mark in _PORT_TAKEN_MARKS)
                raise (PortTaken if taken else StartError)(
                    f"{proc.name} exited during start-up; its log ends with:\n{tail}"
                )
            with contextlib.suppress(OSError, ValueError):
                status, body = http_json(url, timeout=2.0)
                if status == 200 and (not need_draft or body.get("draft_connected")):
                    return
                if need_draft and body.get("draft_incompatible"):  # waiting longer cannot help
                    raise StartError(f"{proc.name} cannot use the draft: {body.get('draft_error')}")
            time.sleep(0.2)
        raise StartError(f"{proc.name} was not ready in time ({url}); its log ends with:\n{proc.log_tail()}")

    def kill_draft(self, i: int = 0, *, sig: int = signal.SIGKILL) -> None:
        """Stop draft ``i`` (default: SIGKILL, no goodbye to its targets)."""
        draft = self.draft_procs[i]
        if draft:
            draft.signal(sig)
            draft.wait(10)
            draft.close_log()

    def restart_draft(self, i: int = 0, timeout: float = 120.0) -> None:
        """Start draft ``i`` again on the same ports (after :meth:`kill_draft`)."""
        draft = self.draft_procs[i] = self._draft_proc(i)
        draft.start(self._env())
        self._wait_ready(draft, self._draft_ready_url(i), time.monotonic() + timeout)

    def wait_linked(self, timeout: float = 120.0) -> None:
        """Wait until every target is connected to a draft again (after :meth:`restart_draft`)."""
        deadline = time.monotonic() + timeout
        for proc, url in zip(self.target_procs, self.urls, strict=True):
            self._wait_ready(proc, f"{url}/readyz", deadline, need_draft=True)

    def stop(self, grace: float = 10.0) -> None:
        procs = [p for p in [*self.target_procs, *self.draft_procs] if p is not None]
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
