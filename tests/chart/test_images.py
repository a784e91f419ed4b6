"""The Dockerfiles: pinned bases, a non-root user, the right entrypoint, a CPU/CUDA build argument."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import REPO

IMAGES = {"draft": ["starsd", "draft"], "target": ["starsd", "target"], "operator": ["starsd"]}


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_pins_its_base_and_runs_as_non_root(image: str) -> None:
    text = (REPO / "images" / image / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base, "the base image is one pinned build argument"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base[1]), base[1]
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(stages) >= 2 and all(s == "${PYTHON_IMAGE}" for s in stages), "multi-stage, same pinned base"
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert entrypoint and json.loads(entrypoint[1]) == IMAGES[image]
    assert "-c requirements.lock" in text, "installs at the locked versions"


@pytest.mark.parametrize("image", ["draft", "target"])
def test_model_server_images_have_a_cpu_and_a_cuda_variant(image: str) -> None:
    text = (REPO / "images" / image / "Dockerfile").read_text()
    assert "ARG VARIANT=cpu" in text
    assert re.search(r"^\s+cpu\)", text, re.M) and re.search(r"^\s+cuda\)", text, re.M)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd and f"/models/{image}" in json.loads(cmd[1])
