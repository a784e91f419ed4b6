"""What a step asks of the device: the operator counter counts every dispatched operator (a step's count grows by
the same amount with each layer), the kernel timer adds up the profiler's device time and, off CUDA, runs the
step once and reports no figure."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from starsd.bench import device_work
from starsd.bench.measure_gpu import SHAPES, load_model
from starsd.verifier.runner import StepRow, TargetRunner


def test_each_dispatched_operator_is_counted_once() -> None:
    x = torch.arange(6, dtype=torch.float32)
    with device_work.count_ops() as ops:
        y = (x * 2 + 1).sum()
    assert ops.count == 3 and float(y) == 36.0
    with device_work.count_ops() as none:
        z = x.shape[0] + 1  # no operator: shapes are read on the host
    assert none.count == 0 and z == 7


def _verify_step_ops(layers: int) -> int:
    """Operators of one target verify step (2 rows, gamma 3) on a tiny model of ``layers`` layers."""
    runner = TargetRunner(load_model(f"tiny-{layers}", "cpu", "float32"), cuda_graphs="off")
    rng = random.Random(0)
    sessions = [runner.new_session([rng.randrange(256) for _ in range(12)]) for _ in range(2)]
    runner.step([StepRow(s, prefill=11) for s in sessions])
    with device_work.count_ops() as ops:
        runner.step([StepRow(s, drafts=[rng.randrange(256) for _ in range(3)]) for s in sessions])
    return ops.count


def test_a_steps_operator_count_grows_by_the_same_amount_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    hidden, inter, _, heads, kv, vocab = SHAPES["tiny"]
    for layers in (1, 2, 3):
        monkeypatch.setitem(SHAPES, f"tiny-{layers}", (hidden, inter, layers, heads, kv, vocab))
    one, two, three = (_verify_step_ops(n) for n in (1, 2, 3))
    assert two - one == three - two > 10  # a decoder layer is more than a handful of operators


def test_device_time_adds_up_the_own_time_of_each_event_that_ran_on_the_device() -> None:
    cuda, cpu = SimpleNamespace(name="CUDA"), SimpleNamespace(name="CPU")
    events = [
        SimpleNamespace(device_type=cuda, self_device_time_total=1500.0),  # a kernel: 1.5 ms
        SimpleNamespace(device_type=cuda, self_device_time_total=500.0, is_user_annotation=False),  # a copy
        SimpleNamespace(device_type=cpu, self_device_time_total=2000.0),  # the host op that launched them
        SimpleNamespace(device_type=cuda, self_device_time_total=2000.0, is_user_annotation=True),  # a span
    ]
    assert device_work.device_seconds(events) == pytest.approx(0.002)
    assert device_work.device_seconds([]) == 0.0


def test_off_cuda_the_step_runs_once_and_no_kernel_time_is_reported() -> None:
    calls: list[int] = []
    assert device_work.kernel_seconds(lambda: calls.append(1), torch.device("cpu")) is None
    assert calls == [1]


def test_on_cuda_the_step_runs_once_under_the_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch's flow, driven on the CPU with a stand-in for torch's profiler: it starts, the step runs
    once, the device is waited for before it stops, and the device events it saw are summed."""
    import torch.profiler

    seen: list[str] = []

    class Profiler:
        def __init__(self, activities: list[object]) -> None:
            assert activities == [torch.profiler.ProfilerActivity.CUDA]

        def __enter__(self) -> Profiler:
            seen.append("start")
            return self

        def __exit__(self, *_: object) -> None:
            seen.append("stop")

        def events(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(device_type=SimpleNamespace(name="CUDA"), self_device_time_total=250.0)] * 4

    monkeypatch.setattr(torch.profiler, "profile", Profiler)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append("wait"))
    seconds = device_work.kernel_seconds(lambda: seen.append("step"), torch.device("cuda"))
    assert seen == ["start", "step", "wait", "stop"] and seconds == pytest.approx(0.001)


def test_a_profiler_that_cannot_start_costs_the_figure_not_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.profiler

    class Refused:
        def __init__(self, **_: object) -> None:
            raise RuntimeError("CUPTI is not available")

    monkeypatch.setattr(torch.profiler, "profile", Refused)
    calls: list[int] = []
    assert device_work.kernel_seconds(lambda: calls.append(1), torch.device("cuda")) is None
    assert calls == [1]
