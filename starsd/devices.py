"""Where a model runs and in which precision: ``--device`` and ``--dtype`` (torch-free until resolved).

``auto`` means CUDA and bfloat16 when a GPU is visible, else the CPU and float32 (bfloat16 on the CPU works but
is slower than float32 on most CPUs, so it is chosen only when asked for).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starsd import defaults

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"
DTYPES = defaults.DTYPES
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(text: str) -> str:
    """``text`` if it names a device we can resolve, else a ValueError that lists the choices."""
    if not _DEVICE.match(text):
        raise ValueError(f"--device must be one of {DEVICE_CHOICES}, got {text!r}")
    return text


def check_dtype(text: str) -> str:
    if text not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {text!r}")
    return text


@dataclass(frozen=True)
class Placement:
    """A resolved device and dtype (torch objects)."""

    device: Any  # torch.device
    dtype: Any  # torch.dtype

    def describe(self) -> str:
        return f"{self.device} {str(self.dtype).removeprefix('torch.')}"


def resolve(device: str = "auto", dtype: str = "auto") -> Placement:
    """Turn the flags into a :class:`Placement`; a CUDA device asked for on a machine without one is an error."""
    import torch

    check_device(device)
    check_dtype(dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA device is visible (torch.cuda.is_available() is False)")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    resolved = torch.device(device)
    if dtype == "auto":
        dtype = "bfloat16" if resolved.type == "cuda" else "float32"
    return Placement(device=resolved, dtype=getattr(torch, dtype))


# The words every refusal starts with: the operator recognises a pod that stopped for this (its diagnosis).
CUDA_REFUSAL = "cannot use the GPU it was told to use"


def cuda_refusal(device: str, *, torch_version: str, cuda_build: str | None, visible: int, node: str) -> str | None:
    """Why a process told ``--device cuda[:N]`` cannot run there, or None (also for ``auto`` and ``cpu``).

    ``cuda_build`` is torch's CUDA version (None for a CPU-only build), ``visible`` the GPUs it sees. The message
    names the image variant and the node, so a pod's termination message says which one is wrong: a CPU-only
    image on a GPU node would otherwise decode on the CPU while holding the GPU.
    """
    if not device.startswith("cuda"):
        return None
    head = f"--device {device} on node {node}: {CUDA_REFUSAL}"
    if cuda_build is None:
        return (
            f"{head}: this image's torch {torch_version} is a CPU-only build (the image's cpu variant, tag suffix "
            "-cpu); run the release's CUDA image (the tag without -cpu, what `make images` builds) on GPU nodes"
        )
    index = int(device.partition(":")[2] or 0)
    if visible == 0:
        return (
            f"{head}: no GPU is visible (torch {torch_version} is a CUDA {cuda_build} build, the image's cuda "
            "variant); the pod got no GPU: check the node's NVIDIA device plugin (or GPU Operator) and the "
            "container's nvidia.com/gpu limit"
        )
    if index >= visible:
        return f"{head}: only {visible} GPU(s) are visible (torch {torch_version}, CUDA {cuda_build} build)"
    return None


def node_name(env: Mapping[str, str] | None = None) -> str:
    """The Kubernetes node this process runs on (``$STARSD_NODE_NAME``), else the host's name."""
    env = os.environ if env is None else env
    return env.get(defaults.NODE_NAME_ENV) or socket.gethostname()


def start_check(device: str) -> str | None:
    """:func:`cuda_refusal` for this process and machine: called at start, before any model is loaded."""
    if not device.startswith("cuda"):
        return None
    import torch

    cuda_build = torch.version.cuda or getattr(torch.version, "hip", None)
    visible = torch.cuda.device_count() if cuda_build else 0
    return cuda_refusal(
        device, torch_version=torch.__version__, cuda_build=cuda_build, visible=visible, node=node_name()
    )
