"""A small client for the e2e tests: kubectl and helm against the local test cluster, plus polling."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class KubectlError(RuntimeError):
    """A kubectl or helm command failed; carries its stderr, which the API server's message is in."""

    def __init__(self, args: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr.strip()}")
        self.stderr = proc.stderr
        self.returncode = proc.returncode


@dataclass(frozen=True)
class Cluster:
    """The running test cluster: where its kubeconfig and tools are, and helpers that use them."""

    repo: Path
    state_dir: Path  # .cluster/

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def bin_dir(self) -> Path:
        return self.state_dir / "bin"

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process that should talk to this cluster as the admin."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bin_dir}:{os.environ['PATH']}"}

    def track(self, name: str, pid: int) -> None:
        """Records a process a test started, so that `cluster.sh down` stops it even if pytest was killed."""
        (self.state_dir / "pids" / f"test-{name}.pid").write_text(f"{pid}\n")

    def untrack(self, name: str) -> None:
        (self.state_dir / "pids" / f"test-{name}.pid").unlink(missing_ok=True)

    def _run(
        self, tool: str, args: tuple[str, ...], stdin: str | None, check: bool, timeout: float, kubeconfig: Path | None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / tool), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(argv, proc)
        return proc

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 60,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return self._run("kubectl", args, stdin, check, timeout, kubeconfig)

    def helm(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return self._run("helm", args, None, check, timeout, None)

    def get(self, kind: str, name: str = "", namespace: str | None = None, selector: str = "") -> Any:
        """`kubectl get -o json`, parsed; a list's items when no name is given."""
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        data = json.loads(self.kubectl(*args).stdout)
        return data if name else data["items"]

    def apply(
        self, manifest: str, namespace: str | None = None, check: bool = True, server_side: bool = False
    ) -> subprocess.CompletedProcess[str]:
        args = ["apply", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        return self.kubectl(*args, stdin=manifest, check=check)


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 60, interval: float = 0.5) -> T:
    """Polls probe until it returns something truthy and returns that; fails with `what` after timeout.

    The last exception the probe raised (if any) is kept in the failure message.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except (KubectlError, KeyError, IndexError, TypeError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of that type, or None."""
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == kind:
            return c
    return None


def condition_status(obj: dict[str, Any], kind: str) -> str | None:
    """ "True", "False" or "Unknown" for that condition type; None when it is absent."""
    found = condition(obj, kind)
    return None if found is None else str(found.get("status"))
