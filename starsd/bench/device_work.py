"""What one step asks of the device: how many operators the host dispatches, and on CUDA how long the device
spends in kernels.

A step that is bound by the host (Python, kernel launches) keeps the device idle between its kernels: its CUDA
time (between two events around the step) is far above its kernel time. Eager ``transformers`` dispatches each
operator from Python, and each dispatched operator on a GPU is at least one kernel launch, so the operator count
is the step's launch count in eager mode; a replayed CUDA graph is one launch for all of its kernels, and only
the operators around it (the copies into its static inputs, the sampling) are dispatched.

:func:`count_ops` counts dispatched operators on any device (torch's dispatch mode). :func:`kernel_seconds`
runs a step under torch's profiler with CUDA activity and sums the device's kernel and copy time; off CUDA, or
where the profiler cannot run, it runs the step unprofiled and says None: a missing figure, never a failed step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class OpCount:
    count: int = 0


@contextmanager
def count_ops() -> Iterator[OpCount]:
    """Count the aten operators dispatched by the code run inside (what reaches a device kernel)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counter = OpCount()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            counter.count += 1
            return func(*args, **(kwargs or {}))

    with Ops():
        yield counter


def device_seconds(events: Any) -> float:
    """The device time of a profiler's events (``profile.events()``): the own time of each event that ran on a
    device, summed (microseconds in, seconds out). Host events carry their kernels' time too and user annotations
    span others: both are left out, so each kernel and copy counts once."""
    total = 0.0
    for event in events:
        on_host = getattr(getattr(event, "device_type", None), "name", "CPU") == "CPU"
        if not on_host and not getattr(event, "is_user_annotation", False):
            total += float(event.self_device_time_total)
    return total / 1e6


def kernel_seconds(step: Callable[[], object], device: Any) -> float | None:
    """Run ``step`` once; on CUDA under torch's profiler, returning the device's busy time in it (kernels and
    copies), else None (off CUDA, or when the profiler cannot start or report: the step still runs, once)."""
    import torch

    if torch.device(device).type != "cuda":
        step()
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        profiler = profile(activities=[ProfilerActivity.CUDA])
        profiler.__enter__()
    except Exception as exc:  # no CUPTI, a profiler already running: the figure is missing, the step is not
        log.warning("the CUDA profiler did not start (%s); kernel time not measured", exc)
        step()
        return None
    stopped = False
    try:
        step()
        torch.cuda.synchronize(device)
    finally:
        try:
            profiler.__exit__(None, None, None)
            stopped = True
        except Exception as exc:
            log.warning("the CUDA profiler did not stop cleanly (%s); kernel time not measured", exc)
    if not stopped:
        return None
    try:
        return device_seconds(profiler.events())
    except Exception as exc:
        log.warning("the CUDA profiler's events could not be read (%s); kernel time not measured", exc)
        return None
