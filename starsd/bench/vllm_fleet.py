"""`vllm serve` processes of vLLM's CPU build (installed apart, in ``.venv-vllm/``) on loopback, with StarSD's
proposer, vLLM's own in-process draft model, or no speculation: what `starsd bench vllm` and `make test-vllm`
run beside StarSD drafts (docs/vllm.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from starsd.local import free_port, http_json

ROOT = Path(__file__).resolve().parents[2]  # this checkout: vLLM imports the proposer from it
DEFAULT_VENV = Path(os.environ.get("STARSD_VLLM_VENV", ROOT / ".venv-vllm"))  # `make test-vllm` installs it
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
MAX_MODEL_LEN = 1024
SERVED_NAME = "target"
PROPOSER = "starsd.integrations.vllm.StarSDProposer"


def starsd_speculation(num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's speculative config for StarSD's proposer (the draft's address comes from ``STARSD_DRAFT``)."""
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_speculative_tokens}


def draft_model_speculation(draft: Path, num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's own speculation with ``draft`` loaded in the same process as the target."""
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": num_speculative_tokens}


def vllm_env(venv: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """vLLM's CPU environment (docs/vllm.md): the CPU platform, a small key/value cache, offline, tcmalloc and
    the venv's OpenMP preloaded where present, this checkout's starsd first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARSD_", "VIRTUAL_ENV"))}
    preload = [str(p) for p in (TCMALLOC, venv / "lib" / "libiomp5.so") if p.is_file()]
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_HOST_IP="127.0.0.1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        LD_PRELOAD=":".join(preload),
        **extra,
    )
    return env


def prometheus_totals(text: str) -> dict[str, float]:
    """Prometheus text as one figure per metric name, summed over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


@dataclass
class VllmServer:
    """One `vllm serve` of a checkpoint, with or without speculation."""

    name: str
    model: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    speculative: dict[str, Any] | None = None
    venv: Path = DEFAULT_VENV
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmServer:
        argv = [str(self.venv / "bin" / "vllm"), "serve", str(self.model), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)]
        argv += ["--served-model-name", SERVED_NAME]
        if self.speculative is not None:
            argv += ["--speculative-config", json.dumps(self.speculative)]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - held open for the process's lifetime
        # A session of its own: stopping the server stops its engine and worker processes too.
        self.popen = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=vllm_env(self.venv, self.env),
            start_new_session=True,
        )
        return self

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited during start-up; its log ends with:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if http_json(f"{self.url}/health", timeout=2.0)[0] == 200:
                    return
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} was not ready in time; its log ends with:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            if self.wait_exit(30) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.wait_exit(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over their labels (``vllm:spec_decode_num_drafts_total`` ...)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            return prometheus_totals(resp.read().decode())


@contextlib.contextmanager
def running(*servers: VllmServer, start_seconds: float) -> Iterator[tuple[VllmServer, ...]]:
    """Start the servers together (their start-ups overlap), wait at most ``start_seconds`` for all, and stop
    them all at the end."""
    try:
        for s in servers:
            s.start()
        deadline = time.monotonic() + start_seconds
        for s in servers:
            s.wait_ready(deadline)
        yield servers
    finally:
        for s in servers:
            s.stop()
