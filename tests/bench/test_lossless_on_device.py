"""Lossless on every device: the same checks on the CPU and, where a GPU is visible, on CUDA (the ``cuda``
variants skip with the reason otherwise; ``bench/gpu/run.sh`` runs them on the GPU with ``-k cuda``).

* the batched verifier on the device gives the per-sequence CPU reference's verdicts for identical draws;
* with the device's own generators, the first draft is accepted with probability ``sum(min(p, q))`` and the
  first emitted token is distributed as ``p`` (chi-square);
* speculative greedy decoding through the runners in fp32 equals the target alone (the shipped pair);
* where the runners have CUDA graphs, a replayed step gives the eager step's tokens and log-probabilities.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from starsd.bench.lossless import greedy_probe, speculative_greedy, target_alone
from starsd.bench.step import graphs_parameter, runner_options
from starsd.checkpoints import load_checkpoint
from starsd.draft.runner import DraftRunner
from starsd.sampling import exponential_race, step_draws, verify, verify_batch
from starsd.verifier.runner import StepRow, TargetRunner
from tests.stats import chi2_statistic, fits

NO_CUDA = "no CUDA device is visible: the GPU variant is skipped"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)),
]


def _dists(gen: torch.Generator, rows: int, vocab: int, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, generator=gen) * sharp, dim=-1)


@pytest.mark.parametrize("device", DEVICES)
def test_the_batched_verifier_gives_the_cpu_reference_verdicts_for_identical_draws(device: str) -> None:
    batch, gamma, vocab = 64, 4, 50
    gen = torch.Generator().manual_seed(3)
    q = torch.stack([_dists(gen, gamma, vocab) for _ in range(batch)])  # [B, G, V]
    p = torch.stack([_dists(gen, gamma + 1, vocab) for _ in range(batch)])  # [B, G + 1, V]
    drafts = torch.stack([torch.multinomial(q[b], 1, generator=gen).squeeze(-1) for b in range(batch)])
    seeds = list(range(100, 100 + batch))
    # The draws as the servers make them (each row's own stream), on the CPU, then moved: identical on both sides.
    uniforms, races = step_draws(
        [gamma] * batch, gamma, vocab, [torch.Generator().manual_seed(s) for s in seeds], torch.device("cpu")
    )
    on = torch.device(device)
    verdict = verify_batch(
        drafts.to(on), torch.full((batch,), gamma, device=on), q.to(on), p.to(on), uniforms.to(on), races.to(on)
    )
    accepted, last = verdict.accepted.cpu().tolist(), verdict.last.cpu().tolist()
    for b in range(batch):
        ref = verify(drafts[b].tolist(), q[b], p[b], torch.Generator().manual_seed(seeds[b]))
        assert (accepted[b], last[b]) == (ref.accepted, ref.tokens[-1]), b
    assert 0 < sum(accepted) < batch * gamma  # both outcomes happen: the comparison covers both paths


@pytest.mark.parametrize("device", DEVICES)
def test_acceptance_is_sum_min_p_q_and_the_output_is_distributed_as_p_with_the_devices_generators(device: str) -> None:
    trials, vocab = 40000, 8
    on = torch.device(device)
    gen = torch.Generator(device=on).manual_seed(11)
    shapes = torch.Generator().manual_seed(5)
    p1, q1 = _dists(shapes, 1, vocab, 1.0)[0], _dists(shapes, 1, vocab, 1.0)[0]
    p = torch.stack([p1, _dists(shapes, 1, vocab)[0]]).to(on)  # [G + 1, V]
    q = q1.to(on).unsqueeze(0)  # [G, V], gamma 1
    drafts = torch.multinomial(q[0], trials, replacement=True, generator=gen).unsqueeze(1)  # [T, 1]
    uniforms = torch.rand(trials, 1, generator=gen, device=on)
    races = exponential_race((trials, vocab), gen, on)
    verdict = verify_batch(
        drafts, torch.ones(trials, dtype=torch.long, device=on), q.expand(trials, -1, -1),
        p.expand(trials, -1, -1), uniforms, races,
    )  # fmt: skip
    rate = float(verdict.accepted.float().mean())
    expected = float(torch.minimum(p1, q1).sum())
    sigma = math.sqrt(expected * (1 - expected) / trials)
    assert abs(rate - expected) < 4 * sigma, (rate, expected)
    first = torch.where(verdict.accepted.bool(), drafts[:, 0], verdict.last)
    counts = torch.bincount(first, minlength=vocab).cpu().tolist()
    assert fits(counts, p1.tolist()), chi2_statistic(counts, p1.tolist())


@pytest.mark.parametrize("device", DEVICES)
def test_speculative_greedy_in_fp32_equals_the_target_alone(device: str, shipped_pair: tuple[Path, Path]) -> None:
    draft, target = (load_checkpoint(path, device, "float32") for path in shipped_pair)
    prompts = [target.tokenizer.encode(t) for t in ("def __init__(self", "import os\n", "for i in range(", "# C")]
    outs, drafted, accepted = speculative_greedy(DraftRunner(draft), TargetRunner(target), prompts, 12, 4)
    assert outs == [target_alone(TargetRunner(target), p, 12) for p in prompts]
    assert 0 < accepted < drafted  # the draft helped, and rejections were exercised
    probe = greedy_probe(draft, target, prompts, 12, 4)
    assert (probe.identical_outputs, probe.match_rate, probe.over_tolerance) == (len(prompts), 1.0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_a_cuda_graph_replay_gives_the_eager_steps_tokens_and_logprobs(
    device: str, shipped_pair: tuple[Path, Path]
) -> None:
    if device != "cuda":
        pytest.skip("CUDA graphs exist on CUDA only")
    if graphs_parameter(TargetRunner) is None:
        pytest.skip("the target runner has no cuda_graphs option here")
    target = load_checkpoint(shipped_pair[1], device, "float32")
    prompts = [target.tokenizer.encode(t) for t in ("def __init__(self", "import os\n", "for i in range(", "# C")]
    tokens, logprobs = [], []
    for mode in ("eager", "graphs"):
        runner = TargetRunner(target, **runner_options(TargetRunner, mode))
        sessions = [runner.new_session(p) for p in prompts]
        runner.step([StepRow(s, prefill=len(p) - 1) for s, p in zip(sessions, prompts, strict=True)])
        steps = [runner.step([StepRow(s, logprobs=2) for s in sessions]) for _ in range(6)]  # decode steps
        tokens.append([[o.tokens for o in step] for step in steps])
        logprobs.append([e.logprob for step in steps for o in step for e in o.logprobs or []])
    assert tokens[0] == tokens[1]
    # A replay may run a padded batch-size bucket, whose kernels may sum in another order than the eager step's
    # (the runners' own tests hold each bucket to eager exactly): the log-probabilities agree to fp32 noise.
    assert logprobs[1] == pytest.approx(logprobs[0], abs=1e-4) and len(logprobs[0]) == 6 * len(prompts)
