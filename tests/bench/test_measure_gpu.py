"""The accelerator-profile measurement runs StarSD's own draft and target runners end to end on a CPU (tiny
shapes, or the shipped checkpoints) and writes a profile that the rest of StarSD loads; the real run needs a
GPU (see the module's docstring). Bad input is refused with the reason and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starsd import system_model
from starsd.bench import profiles
from starsd.cli import main
from starsd.draft.runner import DraftRunner
from starsd.verifier.runner import TargetRunner


def _args(out: Path, *extra: str) -> list[str]:
    small = ["--device", "cpu", "--dtype", "float32", "--context", "8", "--repeats", "2", "--gamma", "3"]
    return ["bench", "measure-gpu", *small, "--out", str(out), *extra]


def test_tiny_cpu_run_writes_a_loadable_measured_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(_args(out, "--draft", "tiny", "--target", "tiny", "--batches", "1,2,4")) == 0
    p = profiles.load_profile_json(out)
    assert p.kind == "measured" and p.gamma == 3
    curve = p.curve()
    assert curve is not None and [b for b, _ in curve.points] == [1, 2, 4]
    assert p.tq == curve.tq(1) and p.tp > 0 and p.tp1 > 0
    assert system_model.optimal_targets(p.tq, p.tp, p.tc) >= 1
    captured = capsys.readouterr()
    assert "Tq(B)" in captured.out
    assert "Tq(B=4)" in captured.err and "Tp(3)" in captured.err  # progress, stage by stage


def test_the_timed_calls_are_the_servers_runners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every draft round is one propose_batch of B sessions with gamma greedy tokens each after one new token,
    and every target repeat one step of one row: the profile describes the code the servers run."""
    batches: list[tuple[int, list[int], list[int]]] = []  # (sessions, new tokens per session, tokens proposed)
    steps: list[int] = []
    propose_batch, step = DraftRunner.propose_batch, TargetRunner.step

    def counted_propose(self: DraftRunner, requests: list) -> list:  # type: ignore[type-arg]
        proposals = propose_batch(self, requests)
        batches.append((len(requests), [len(r.new_tokens) for r in requests], [len(p.token_ids) for p in proposals]))
        return proposals

    def counted_step(self: TargetRunner, rows: list) -> list:  # type: ignore[type-arg]
        steps.append(len(rows))
        return step(self, rows)

    monkeypatch.setattr(DraftRunner, "propose_batch", counted_propose)
    monkeypatch.setattr(TargetRunner, "step", counted_step)
    assert main(_args(tmp_path / "p.json", "--draft", "tiny", "--target", "tiny", "--batches", "1,3")) == 0
    warmup, repeats = 3, 2
    for b in (1, 3):
        mine = [x for x in batches if x[0] == b]
        assert mine[0] == (b, [8] * b, [3] * b)  # the prompts' prefill
        assert mine[1:] == [(b, [1] * b, [3] * b)] * (warmup + repeats)
    assert steps == [1] * (1 + 2 * (warmup + repeats))  # prefill, then verify and decode rounds


def test_checkpoints_are_measured_as_the_servers_load_them(tmp_path: Path, shipped_pair: tuple[Path, Path]) -> None:
    draft, target = shipped_pair
    out = tmp_path / "p.json"
    assert main(_args(out, "--draft", str(draft), "--target", str(target), "--batches", "1,2")) == 0
    written = json.loads(out.read_text())
    assert written["draft"] == "checkpoint draft, float32" and written["target"] == "checkpoint target, float32"
    assert written["name"] == "cpu-target_draft"
    assert profiles.load_profile_json(out).tp > 0


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--batches", "2,4"], "--batches must hold 1"),
        (["--draft", "no-such-model"], "--draft 'no-such-model' is neither a shape"),
        (["--device", "cuda:7", "--draft", "tiny"], "--device cuda:7"),
        (["--context", "5000", "--draft", "tiny", "--target", "{target}"], "holds 1024 positions"),
    ],
)
def test_bad_input_is_refused_with_the_reason(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shipped_pair: tuple[Path, Path],
    extra: list[str],
    reason: str,
) -> None:
    out = tmp_path / "p.json"
    extra = [x.replace("{target}", str(shipped_pair[1])) for x in extra]
    assert main([*_args(out), *extra]) == 2
    assert reason in capsys.readouterr().err
    assert not out.exists()
