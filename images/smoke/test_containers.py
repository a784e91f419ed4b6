"""`make images-test`: the built images as containers, the way a user first runs them.

A draft and two targets on one container network (the targets reach the draft by its container name), each
container non-root with a read-only root file system and only /tmp writable (as the operator's pods run), the
shipped models (models/) mounted read-only at /models, where the images look by default. Greedy completions
through each target equal the target model alone, and the draft really takes part. Needs the images
(`make images`) and a Docker engine: DOCKER_HOST as `images/engine.sh` prints it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from starsd.checkpoints import LoadedModel, load_checkpoint
from starsd.local import http_json
from tests.support.reference import autoregressive_reference

REPO = Path(__file__).resolve().parents[2]
TAG = os.environ.get("STARSD_IMAGE_TAG", "dev")
DRAFT, TARGET, OPERATOR = (f"starsd/{name}:{TAG}" for name in ("draft", "target", "operator"))
MODELS = ["-v", f"{REPO / 'models'}:/models:ro"]  # the shipped pair, at the images' default paths
UID = 10001  # the images' user, as operator/starsd_operator/constants.py RUN_AS_USER
MAX_TOKENS = 24
PROMPTS = ["def __init__(self", "import os\nimport sys\n", "for i in range(", "class Parser:\n    def parse("]
# As the operator's pods: no writable root, no capabilities, no privilege gain, /tmp an empty scratch dir.
HARDENED = ["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@pytest.fixture(scope="module", autouse=True)
def images_present() -> None:
    if docker("version", check=False).returncode != 0:
        pytest.fail("no Docker engine answers: run `make images-test` (it starts one) or set DOCKER_HOST")
    missing = [ref for ref in (DRAFT, TARGET, OPERATOR) if docker("image", "inspect", ref, check=False).returncode]
    assert not missing, f"build the images first (make images): missing {missing}"


@dataclass
class Star:
    network: str
    draft: str
    targets: list[str]
    urls: list[str]


def logs(name: str) -> str:
    done = docker("logs", "--tail", "40", name, check=False)
    return done.stdout + done.stderr


def wait_ready(name: str, url: str, limit: float = 180) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
        if not state["Running"]:
            raise AssertionError(f"{name} exited ({state['ExitCode']}):\n{logs(name)}")
        try:
            if http_json(f"{url}/readyz", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"{name} not ready after {limit}s:\n{logs(name)}")


@pytest.fixture(scope="module")
def star() -> Iterator[Star]:
    run = uuid.uuid4().hex[:8]
    network, draft = f"starsd-smoke-{run}", f"starsd-smoke-{run}-draft"
    targets = [f"starsd-smoke-{run}-target-{i}" for i in range(2)]
    docker("network", "create", network)
    try:
        docker("run", "-d", "--name", draft, "--network", network, *HARDENED, *MODELS, DRAFT)
        for name in targets:
            container = ["--name", name, "--network", network, "-p", "127.0.0.1::8000", *HARDENED, *MODELS]
            serve = ["--model", "/models/target", "--port", "8000", "--draft", f"{draft}:50051", "--id", name]
            docker("run", "-d", *container, TARGET, *serve)
        urls = []
        for name in targets:
            host_port = docker("port", name, "8000/tcp").stdout.split()[0].rsplit(":", 1)[1]
            urls.append(f"http://127.0.0.1:{host_port}")
            wait_ready(name, urls[-1])
        yield Star(network, draft, targets, urls)
    finally:
        for name in [draft, *targets]:
            docker("rm", "-f", name, check=False)
        docker("network", "rm", network, check=False)


@pytest.fixture(scope="module")
def target_alone() -> LoadedModel:
    return load_checkpoint(REPO / "models" / "target")


def greedy_alone(model: LoadedModel, prompt: str) -> list[int]:
    out = autoregressive_reference(model, model.tokenizer.encode(prompt), MAX_TOKENS)
    return out[: out.index(model.eos_token_id)] if model.eos_token_id in out else out


@pytest.mark.parametrize("image", [DRAFT, TARGET])
def test_help_runs_in_each_image(image: str) -> None:
    done = docker("run", "--rm", *HARDENED, image, "--help")
    assert "usage: starsd" in done.stdout, done.stdout + done.stderr


def test_help_runs_in_the_operator_image() -> None:
    done = docker("run", "--rm", *HARDENED, OPERATOR, "operator", "--help")
    assert "usage: starsd operator" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("image", [DRAFT, TARGET, OPERATOR])
def test_images_run_as_the_unprivileged_user_and_cannot_write_their_root(image: str) -> None:
    assert docker("image", "inspect", "-f", "{{.Config.User}}", image).stdout.strip() == f"{UID}:{UID}"
    probe = "id -u; touch /opt/starsd/x 2>/dev/null && echo root-writable; touch /tmp/x && echo tmp-writable"
    done = docker("run", "--rm", *HARDENED, "--entrypoint", "sh", image, "-c", probe)
    assert done.stdout.split() == [str(UID), "tmp-writable"], done.stdout + done.stderr


def test_each_target_completes_like_the_target_alone(star: Star, target_alone: LoadedModel) -> None:
    for name, url in zip(star.targets, star.urls, strict=True):
        drafted = 0
        for prompt in PROMPTS:
            status, body = http_json(
                f"{url}/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
            )
            assert status == 200, body
            assert body["starsd"]["token_ids"] == greedy_alone(target_alone, prompt), (name, prompt)
            assert body["starsd"]["fallback_tokens"] == 0, (name, body["starsd"])
            drafted += body["starsd"]["drafted_tokens"]
        assert drafted > 0, f"{name} never used the draft: {logs(name)}"


def test_the_draft_reports_both_targets_connected(star: Star) -> None:
    """The draft's own load report (its metrics port, not published: read from inside its container)."""
    read = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9090/v1/load').read().decode())"
    load = json.loads(docker("exec", star.draft, "python3", "-c", read).stdout)
    assert load["targets"] == 2, load
