"""Where a model runs and in which precision: ``--device`` and ``--dtype`` (torch-free until resolved).

``auto`` means CUDA and bfloat16 when a GPU is visible, else the CPU and float32 (bfloat16 on the CPU works but
is slower than float32 on most CPUs, so it is chosen only when asked for).
"""

from __future__ import annotations

import re
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
