"""A process told ``--device cuda`` that cannot use a GPU stops at start, before any model load, and says why:
the image variant (a CPU-only torch build, or a CUDA build that sees no GPU) and the node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from starsd import cli, defaults
from starsd.commands import _common
from starsd.devices import CUDA_REFUSAL, cuda_refusal, node_name

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here: nothing to refuse")
BOGUS_MODEL = "/nonexistent/starsd-model"  # loading it would fail with "does not exist": the check comes first
COMMANDS = {
    "target": ["target", "--model", BOGUS_MODEL, "--port", "0", "--device", "cuda"],
    "draft": ["draft", "--model", BOGUS_MODEL, "--port", "0", "--metrics-port", "0", "--device", "cuda"],
}


def test_a_cpu_only_torch_build_is_named_as_the_cpu_image_variant() -> None:
    message = cuda_refusal("cuda", torch_version="2.9.0+cpu", cuda_build=None, visible=0, node="gpu-node-7")
    assert message is not None
    assert CUDA_REFUSAL in message and "node gpu-node-7" in message
    assert "CPU-only build" in message and "cpu variant" in message and "without -cpu" in message


def test_a_cuda_build_without_a_visible_gpu_points_at_the_device_plugin() -> None:
    message = cuda_refusal("cuda:0", torch_version="2.9.0+cu128", cuda_build="12.8", visible=0, node="n1")
    assert message is not None
    assert "no GPU is visible" in message and "cuda variant" in message and "node n1" in message
    assert "device plugin" in message and "nvidia.com/gpu" in message


def test_a_usable_gpu_or_another_device_passes() -> None:
    assert cuda_refusal("cuda", torch_version="2.9.0+cu128", cuda_build="12.8", visible=1, node="n") is None
    assert cuda_refusal("cpu", torch_version="2.9.0+cpu", cuda_build=None, visible=0, node="n") is None
    assert cuda_refusal("auto", torch_version="2.9.0+cpu", cuda_build=None, visible=0, node="n") is None
    too_far = cuda_refusal("cuda:2", torch_version="2.9.0+cu128", cuda_build="12.8", visible=2, node="n")
    assert too_far is not None and "only 2 GPU(s)" in too_far


def test_the_node_comes_from_the_downward_api_variable() -> None:
    assert node_name({defaults.NODE_NAME_ENV: "gpu-node-3"}) == "gpu-node-3"
    assert node_name({}) != ""  # outside Kubernetes: the host's name


@NO_GPU
@pytest.mark.parametrize("role", sorted(COMMANDS))
def test_told_cuda_without_a_gpu_the_command_exits_at_start(role: str) -> None:
    env = {**os.environ, defaults.NODE_NAME_ENV: "gpu-node-9"}
    result = subprocess.run(
        [sys.executable, "-m", "starsd.cli", *COMMANDS[role]], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 2, result.stderr
    assert CUDA_REFUSAL in result.stderr and "on node gpu-node-9" in result.stderr
    assert "does not exist" not in result.stderr  # it never got as far as the model


@NO_GPU
@pytest.mark.parametrize("role", sorted(COMMANDS))
def test_the_refusal_is_the_pods_termination_message(
    role: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")  # the kubelet creates the file; the process fills it
    monkeypatch.setattr(_common, "TERMINATION_LOG", log)
    monkeypatch.setenv(defaults.NODE_NAME_ENV, "gpu-node-9")
    assert cli.main(COMMANDS[role]) == 2
    said = log.read_text()
    variant = "no GPU is visible" if torch.version.cuda else "CPU-only build"  # this machine's torch
    assert CUDA_REFUSAL in said and "gpu-node-9" in said and variant in said
