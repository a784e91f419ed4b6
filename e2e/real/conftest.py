"""The real-pod suite (`make e2e-real`): only with REAL_NODE=1, which makes the session's cluster (the
`cluster` fixture of e2e/conftest.py) start a real node next to kwok's fakes. `make e2e` and `make test`
leave this folder out: it needs root, containerd and the built images."""

from __future__ import annotations

import os

import pytest

from e2e.conftest import CLUSTER_SH, _uncaptured

REAL_NODE = os.environ.get("REAL_NODE") == "1"

if not REAL_NODE:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The real node's binaries build here, outside any test's timeout, like the control plane's (a cold
    build takes tens of minutes)."""
    if not REAL_NODE or session.config.option.collectonly or not session.items:
        return
    if _uncaptured(session.config, ["bash", str(CLUSTER_SH), "build-node"]) != 0:
        raise pytest.UsageError("building the real node failed (see the output above)")
