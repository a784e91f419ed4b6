"""The `helm test` pod's script, run here against a real target server: the request it sends is one the
target's OpenAI API answers, and it fails when the answer is not a completion. (On the e2e cluster kwok runs
no containers, so this is where the script itself gets exercised.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Rendered


@pytest.fixture(scope="module")
def target_url(random_pair: tuple[Path, Path]) -> Iterator[str]:
    """A real `starsd draft` and `starsd target` (tiny random pair) on loopback."""
    from starsd.local import LocalStar

    star = LocalStar(draft_model=random_pair[0], target_model=random_pair[1], targets=1)
    star.start(timeout=240)
    try:
        yield star.urls[0]
    finally:
        star.stop()


KEY = "sk-helm-test-5e4d3c2b1a09f8e7d6c5b4a3"


@pytest.fixture(scope="module")
def keyed_target_url(random_pair: tuple[Path, Path]) -> Iterator[str]:
    """The same, with a target that needs an API key."""
    from starsd.local import LocalStar

    star = LocalStar(draft_model=random_pair[0], target_model=random_pair[1], targets=1, api_keys=(KEY,))
    star.start(timeout=240)
    try:
        yield star.urls[0]
    finally:
        star.stop()


def run_test_pod(
    render: Callable[..., Rendered], url: str, key_env: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The test pod's script as the pod runs it; ``key_env``: the STARSD_API_KEY its Secret gives it."""
    pod = render("sample.yaml", sets=(f"tests.url={url}",)).one("Pod")
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python3", "-c"]
    script, *args = container["args"]
    assert args[0] == url
    env = {k: v for k, v in os.environ.items() if k != "STARSD_API_KEY"}
    if key_env is not None:
        env["STARSD_API_KEY"] = key_env
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def test_helm_test_script_gets_a_completion_from_a_target(render: Callable[..., Rendered], target_url: str) -> None:
    proc = run_test_pod(render, f"{target_url}/v1/completions")
    assert proc.returncode == 0, proc.stderr
    assert "/v1/completions: " in proc.stdout and " tokens: " in proc.stdout


def test_helm_test_script_fails_on_a_wrong_endpoint(render: Callable[..., Rendered], target_url: str) -> None:
    proc = run_test_pod(render, f"{target_url}/v1/no-such-endpoint")
    assert proc.returncode != 0


def test_helm_test_script_sends_the_key_of_its_secret(render: Callable[..., Rendered], keyed_target_url: str) -> None:
    url = f"{keyed_target_url}/v1/completions"
    proc = run_test_pod(render, url, key_env=f"# the key of the test\n{KEY},sk-an-older-key\n")
    assert proc.returncode == 0, proc.stderr
    assert " tokens: " in proc.stdout and KEY not in proc.stdout + proc.stderr


def test_helm_test_script_fails_without_the_key(render: Callable[..., Rendered], keyed_target_url: str) -> None:
    proc = run_test_pod(render, f"{keyed_target_url}/v1/completions")
    assert proc.returncode != 0 and "401" in proc.stderr
