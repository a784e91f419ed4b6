"""Count the host synchronisations of a piece of model code: each one stalls the CPU until the device catches up.

On CUDA, torch says so itself: :func:`torch.cuda.set_sync_debug_mode` ``"warn"`` raises a warning at every
synchronising call (a device-to-host copy, a blocking upload from pageable memory, an op whose output shape
depends on the data, a stream or device synchronise), and the counter records them.

On a CPU nothing synchronises, so the counter counts the calls that would on a GPU, seen through torch's own
hooks (a function mode and a dispatch mode): reads of a tensor's values on the host (``item``, ``int``/``bool``/
``float`` of a tensor, ``tolist``, ``numpy``), ops whose output shape depends on the data (``nonzero``,
``masked_select``, boolean-mask indexing, ``unique``), and uploads written as uploads (``torch.tensor(...,
device=...)``, ``Tensor.to(device)`` without ``non_blocking=True``). Tensors built on the host and moved in
other ways are not seen, and a ``.to(device)`` of a tensor already on the device is counted: the CPU count is
an estimate of the CUDA one, good for comparing two versions of the code, not a measurement.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

CUDA_METHOD = "cuda-sync-debug-mode"
CPU_METHOD = "torch-dispatch-counter"

# aten ops that read values on the host, or whose output shape depends on the data
_SYNCING_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
}
_READS = {"tolist", "numpy"}


@dataclass
class SyncCount:
    method: str = CPU_METHOD
    count: int = 0


def _is_device(x: Any) -> bool:
    import torch

    return isinstance(x, torch.device) or (isinstance(x, str) and x.split(":")[0] in ("cpu", "cuda", "mps", "xpu"))


def _counting_modes(counter: SyncCount) -> tuple[Any, Any]:
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    def function_syncs(name: str, args: Any, kwargs: dict[str, Any]) -> bool:
        if name in _READS:
            return True
        if name in ("tensor", "as_tensor"):
            return kwargs.get("device") is not None
        moves = kwargs.get("device") is not None or any(_is_device(a) for a in args[1:])
        return name == "to" and moves and not kwargs.get("non_blocking", False)

    def op_syncs(name: str, args: Any) -> bool:
        if name in _SYNCING_OPS:
            return True
        indices = args[1] if name == "index" and len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            counter.count += function_syncs(getattr(func, "__name__", ""), args, kwargs)
            return func(*args, **kwargs)

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            counter.count += op_syncs(func.overloadpacket.__name__, args)
            return func(*args, **(kwargs or {}))

    return Functions(), Ops()


@contextmanager
def count_syncs(device: Any) -> Iterator[SyncCount]:
    """Count the host synchronisations of the code run inside (on ``device``: a torch.device or its name).

    Synchronise before entering (the counter must not see the caller's own sync) and after leaving."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        counter = SyncCount(CUDA_METHOD)
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield counter
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        counter.count = sum("synchroniz" in str(w.message) for w in caught)
        return
    counter = SyncCount(CPU_METHOD)
    functions, ops = _counting_modes(counter)
    with functions, ops:
        yield counter


def sync_method(device: Any) -> str:
    """How :func:`count_syncs` counts on ``device``."""
    import torch

    return CUDA_METHOD if torch.device(device).type == "cuda" else CPU_METHOD
