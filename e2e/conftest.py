"""The e2e session: build the control plane (once per machine), bring it up, hand tests a Cluster, and
always bring it down again.

The build runs in pytest_collection_finish, outside any test, so the per-test timeout does not cover a
cold build (tens of minutes on 2 cores); its progress is printed as it goes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType

import pytest

from e2e.kube import Cluster
from e2e.operator_process import (
    OperatorProcess,
    chart_operator_env,
    install_chart,
    service_account_kubeconfig,
)
from starsd.local import LocalStar

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "e2e" / "cluster" / "cluster.sh"
STATE_DIR = Path(os.environ.get("STARSD_CLUSTER_DIR") or REPO / ".cluster")  # as e2e/cluster/lib/common.sh


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under e2e/ needs the cluster: mark it e2e so `-m "not e2e"` leaves it out."""
    e2e_dir = Path(__file__).parent
    for item in items:
        if e2e_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def _uncaptured(config: pytest.Config, argv: list[str]) -> int:
    """Runs argv with pytest's output capture off, so its progress reaches the terminal."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:  # run with -p no:capture
        return subprocess.run(argv, check=False).returncode
    with capture.global_and_fixture_disabled():
        return subprocess.run(argv, check=False).returncode


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    wanted = any(item.get_closest_marker("e2e") for item in session.items)
    if wanted and _uncaptured(session.config, ["bash", str(CLUSTER_SH), "build"]) != 0:
        raise pytest.UsageError("building the e2e cluster failed (see the output above)")


# The operator log lines a failed test's report carries (its namespace's, at INFO and above).
LOG_LINES_ON_FAILURE = 80


def operator_log_excerpt(log: Path, namespace: str, limit: int = LOG_LINES_ON_FAILURE) -> str:
    """The last ``limit`` lines of an operator log that name ``namespace`` (DEBUG lines left out), with the
    traceback lines that follow them: what the operator did for one test's clusters."""
    if not log.exists():
        return f"(no operator log at {log})"
    kept: list[str] = []
    following = False
    for line in log.read_text(errors="replace").splitlines():
        if line[:4].isdigit():  # a record's first line starts with its timestamp
            following = namespace in line and " DEBUG " not in line
        if following:
            kept.append(line)
    return "\n".join(kept[-limit:]) or f"(no line of {log.name} names {namespace})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """A failed e2e test's report shows what the operator logged for its namespace (CI keeps only the
    report; the logs under .cluster/logs/ go with the machine)."""
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    process, namespace = funcargs.get("operator"), funcargs.get("namespace")
    if report.when == "call" and report.failed and isinstance(process, OperatorProcess) and namespace:
        report.sections.append(
            (
                f"operator log ({process.log_path.name}, {namespace})",
                operator_log_excerpt(process.log_path, str(namespace)),
            )
        )


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The running cluster. Brought down at the end of the session, whatever happened (a SIGTERM is turned
    into KeyboardInterrupt so that the teardown still runs). STARSD_E2E_REUSE_CLUSTER=1 uses a cluster that
    is already up and leaves it up."""
    if os.environ.get("STARSD_E2E_REUSE_CLUSTER") == "1" and (STATE_DIR / "kubeconfig").exists():
        # For iterating on tests: use the cluster `make cluster-up` started, and leave it running.
        yield Cluster(repo=REPO, state_dir=STATE_DIR)
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        if _uncaptured(request.config, ["bash", str(CLUSTER_SH), "up"]) != 0:
            pytest.fail("the e2e cluster did not come up (logs in .cluster/logs/)")
        yield Cluster(repo=REPO, state_dir=STATE_DIR)
    finally:
        _uncaptured(request.config, ["bash", str(CLUSTER_SH), "down"])
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def draft(cluster: Cluster) -> Iterator[LocalStar]:
    """A real draft server on loopback with an emulated 4 ms service time (the rebalancer reads its load)."""
    star = LocalStar(emulate_service_time=0.004, targets=0)
    try:
        star.start()
        assert star.draft is not None and star.draft.popen is not None
        cluster.track("draft", star.draft.popen.pid)
        yield star
    finally:
        star.stop()
        cluster.untrack("draft")


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for it to go)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Iterator[OperatorProcess]:
    """The chart installed with helm, and `starsd operator` running locally as the chart's ServiceAccount.

    A test that kills the operator must start it again before it ends (see test_operator_restart.py).
    """
    install_chart(cluster)
    kubeconfig = service_account_kubeconfig(cluster, cluster.state_dir / "operator.kubeconfig")
    # The scenarios point clusters at drafts on loopback with the load-url annotation, which the operator
    # honours only with this flag (test_load_url_annotation.py runs one without it).
    process = OperatorProcess(cluster, kubeconfig, chart_operator_env(cluster), args=("--allow-load-url-annotation",))
    process.start()
    try:
        yield process
    finally:
        process.stop()
