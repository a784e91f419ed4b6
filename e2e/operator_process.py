"""The operator under test: `starsd operator` as a local process, authenticated with a token of the chart's
ServiceAccount, so every API call it makes is checked against the chart's ClusterRole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import IO

from e2e.kube import Cluster, wait_until
from starsd.local import free_port

RELEASE = "starsd"
RELEASE_NAMESPACE = "starsd-system"
# The chart's image.registry here: the real node's containerd holds the images `make images` built, which it
# names docker.io/starsd/NAME:TAG (what docker's starsd/NAME:TAG stands for); kwok's fake nodes pull nothing.
IMAGE_REGISTRY = "docker.io"


def chart_path(cluster: Cluster) -> str:
    """The chart under test: charts/starsd, or $STARSD_E2E_CHART (e.g. a packaged .tgz of it)."""
    return os.environ.get("STARSD_E2E_CHART") or str(cluster.repo / "charts" / "starsd")


def install_chart(cluster: Cluster, *extra: str) -> None:
    """`helm install` (or upgrade) the chart into starsd-system and wait for its Deployment; ``extra`` after
    the image registry, so it may override it."""
    cluster.helm(
        "upgrade",
        "--install",
        RELEASE,
        chart_path(cluster),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "120s",
        "--set",
        f"image.registry={IMAGE_REGISTRY}",
        *extra,
    )


def chart_operator_env(cluster: Cluster) -> dict[str, str]:
    """The plain (value) environment the chart gives the operator container: its image settings."""
    deployment = cluster.get("deployment", f"{RELEASE}-operator", RELEASE_NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def service_account_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's operator ServiceAccount (a bound token)."""
    deployment = cluster.get("deployment", f"{RELEASE}-operator", RELEASE_NAMESPACE)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = cluster.kubectl("create", "token", account, "-n", RELEASE_NAMESPACE, "--duration=4h").stdout.strip()
    admin = json.loads(cluster.kubectl("config", "view", "--raw", "-o", "json").stdout)
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": account}}],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


class OperatorProcess:
    """Starts, kills and restarts `starsd operator`; each run logs to .cluster/logs/operator-N.log."""

    def __init__(
        self,
        cluster: Cluster,
        kubeconfig: Path,
        env: dict[str, str],
        args: tuple[str, ...] = (),
        name: str = "operator",
    ) -> None:
        self.cluster = cluster
        self.args = args
        self.name = name  # its pid file and log names: several may run at once (peering)
        self.kubeconfig = kubeconfig
        self.env = env
        self.port = free_port()
        self.metrics_port = free_port()  # the operator's /metrics (several operators may run here at once)
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.cluster.state_dir / "logs" / f"{self.name}-{self.runs}.log"

    def start(self) -> None:
        assert self.proc is None, "already running"
        self.runs += 1
        self._log = self.log_path.open("wb")
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "starsd.cli",
                "--log-level=DEBUG",
                "operator",
                f"--liveness=http://127.0.0.1:{self.port}/healthz",
                f"--metrics-port={self.metrics_port}",
                "--interval=1",
                *self.args,
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.cluster.repo,
        )
        self.cluster.track(self.name, self.proc.pid)
        wait_until("the operator's /healthz", self.healthy, timeout=60)

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator exited; log: {self.log_path}\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies."""
        self._stop(signal.SIGKILL)

    def stop(self) -> None:
        self._stop(signal.SIGTERM)

    def _stop(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self.cluster.untrack(self.name)
        if self._log:
            self._log.close()
            self._log = None

    def metrics(self) -> dict[str, float]:
        """The operator's own metrics now: ``name{labels}`` -> value (Prometheus text format, parsed)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_contains(self, text: str) -> bool:
        return text in self.log_path.read_text(errors="replace")
