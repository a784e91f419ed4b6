"""``starsd bench step`` times StarSD's own target and draft steps on a CPU (tiny shapes) and writes JSON; its
host-sync counter sees the syncs a step makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from starsd.bench import step as step_bench
from starsd.bench.syncs import CPU_METHOD, count_syncs
from starsd.cli import main
from starsd.draft.runner import DraftRunner
from starsd.verifier.runner import TargetRunner


def _args(out: Path, *extra: str) -> list[str]:
    small = ["--draft", "tiny", "--target", "tiny", "--device", "cpu", "--dtype", "float32", "--warmup", "1"]
    return ["bench", "step", *small, "--repeats", "2", "--json", str(out), *extra]


def test_a_tiny_cpu_run_times_every_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "step.json"
    assert main(_args(out, "--batches", "1,3", "--gammas", "2,4", "--contexts", "8,16")) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "step" and data["complete"] and data["sync_method"] == CPU_METHOD
    keys = [(r["role"], r["context"], r["gamma"], r["batch"], r["slots"]) for r in data["rows"]]
    expected = [
        (role, ctx, gamma, b, slots)
        for role in ("target", "draft")
        for ctx in (8, 16)
        for gamma in (4, 2)  # gamma 4 first: the profile's
        for slots, b in (("consecutive", 1), ("consecutive", 3), ("shuffled", 3))
    ]
    assert keys == expected
    assert all(r["wall_ms"] > 0 and r["cuda_ms"] is None and r["mode"] == "eager" for r in data["rows"])
    assert all(r["ops"] > 0 and r["kernel_ms"] is None and r["captures"] is None for r in data["rows"])
    assert all(r["context_mean"] >= r["context"] for r in data["rows"])
    assert data["skipped"] == ["target graphs: not on CUDA", "draft graphs: not on CUDA"] or not any(
        data["graphs_available"].values()
    )
    captured = capsys.readouterr()
    assert (
        "wall ms" in captured.out
        and "kernel ms" in captured.out
        and "target eager ctx 8 gamma 4 B=3 shuffled" in captured.err
    )


def test_the_timed_calls_are_the_runners_steps_of_b_rows_with_gamma_drafts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[tuple[int, list[int]]] = []
    rounds: list[tuple[int, list[int]]] = []
    step, propose = TargetRunner.step, DraftRunner.propose_batch

    def counted_step(self: TargetRunner, rows: list) -> list:  # type: ignore[type-arg]
        steps.append((len(rows), [len(r.drafts) for r in rows]))
        return step(self, rows)

    def counted_propose(self: DraftRunner, requests: list) -> list:  # type: ignore[type-arg]
        rounds.append((len(requests), [r.gamma for r in requests]))
        return propose(self, requests)

    monkeypatch.setattr(TargetRunner, "step", counted_step)
    monkeypatch.setattr(DraftRunner, "propose_batch", counted_propose)
    argv = _args(tmp_path / "s.json", "--batches", "2", "--gammas", "3", "--contexts", "8", "--slots", "consecutive")
    assert main(argv) == 0
    per_config = 1 + step_bench.INSPECTED + 2  # warm-up, the counted and the profiled steps, the repeats
    assert steps[1:] == [(2, [3, 3])] * per_config  # after the prefill step
    assert rounds[1:] == [(2, [3, 3])] * per_config  # after one prefill of both sessions


def test_shuffled_rows_cost_more_host_syncs_than_consecutive_ones_today() -> None:
    """The counter sees the per-layer upload of a step over scattered slots (kvcache.SlotStepLayer) or, once that is
    gone, the same count for both: never fewer syncs for the scattered step."""
    report = step_bench.run_step_bench(
        step_bench.StepPlan(
            "tiny",
            "tiny",
            roles=("target",),
            batches=(4,),
            gammas=(2,),
            contexts=(8,),
            device="cpu",
            dtype="float32",
            warmup=1,
            repeats=1,
        )
    )
    counts = {r.slots: r.syncs for r in report.rows}
    assert counts["shuffled"] >= counts["consecutive"] >= 1


def test_the_cpu_counter_counts_host_reads_uploads_and_data_dependent_shapes() -> None:
    x = torch.arange(6)
    with count_syncs("cpu") as syncs:
        x.sum().item()
        x.tolist()
        bool(x[0] > 1)
        torch.tensor([1, 2], device="cpu")
        x.to("cpu")
        x[x > 2]
        x.nonzero()
    assert syncs.count == 7
    with count_syncs("cpu") as none:
        y = (x * 2 + 1).softmax(0) if x.is_floating_point() else x * 2 + 1
        torch.arange(4, device="cpu")
        x.to("cpu", non_blocking=True)
    assert none.count == 0 and y.shape == x.shape


def test_runner_options_follow_the_cuda_graphs_parameters_type() -> None:
    class Flag:
        def __init__(self, loaded: object, cuda_graphs: bool = False) -> None: ...

    class Choice:
        def __init__(self, loaded: object, cuda_graphs: str = "auto") -> None: ...

    class Without:
        def __init__(self, loaded: object) -> None: ...

    assert step_bench.runner_options(Flag, "graphs") == {"cuda_graphs": True}
    assert step_bench.runner_options(Choice, "eager") == {"cuda_graphs": "off"}
    assert step_bench.runner_options(Without, "eager") == {}
    with pytest.raises(ValueError, match="no cuda_graphs"):
        step_bench.runner_options(Without, "graphs")


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--draft", "no-such"], "--draft 'no-such' is neither a shape"),
        (["--contexts", "1"], "contexts >= 2"),
        (["--device", "cuda:9"], "--device cuda:9"),
    ],
)
def test_bad_input_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], reason: str
) -> None:
    out = tmp_path / "s.json"
    assert main([*_args(out, "--batches", "1", "--gammas", "2", "--contexts", "8"), *extra]) == 2
    assert reason in capsys.readouterr().err
    assert not out.exists()
