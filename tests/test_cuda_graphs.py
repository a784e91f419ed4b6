"""CUDA graphs of the draft's decoding step and the target's verify step: the bucket arithmetic and the padded
steps (on any device), the capture and replay (on CUDA only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from starsd import cuda_graphs, kvcache
from starsd.checkpoints import load_checkpoint
from starsd.draft.runner import DraftRunner
from starsd.proposals import DraftRequest
from starsd.sampling import SamplingParams
from starsd.verifier.runner import StepRow, TargetRunner
from tests.support.reference import autoregressive_reference

GREEDY = SamplingParams(temperature=0.0)
CUDA = torch.cuda.is_available()


def test_the_mode_is_on_with_cuda_and_off_on_the_cpu() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert cuda_graphs.graphs_enabled("auto", gpu) and not cuda_graphs.graphs_enabled("auto", cpu)
    assert cuda_graphs.graphs_enabled("on", gpu) and not cuda_graphs.graphs_enabled("off", gpu)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        cuda_graphs.graphs_enabled("on", cpu)
    with pytest.raises(ValueError, match="must be one of auto, on, off"):
        cuda_graphs.graphs_enabled("always", gpu)


def test_steps_are_padded_to_the_next_bucket_or_run_eagerly() -> None:
    assert [cuda_graphs.batch_bucket(b) for b in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    assert cuda_graphs.batch_bucket(65) is None
    assert cuda_graphs.length_bucket(1, 4096) == 256
    assert cuda_graphs.length_bucket(256, 4096) == 256
    assert cuda_graphs.length_bucket(257, 4096) == 512
    assert cuda_graphs.length_bucket(900, 1000) is None  # 1024 columns do not fit the pool


def test_padding_rows_attend_only_their_scratch_column_and_real_rows_keep_their_mask() -> None:
    mask = torch.tensor([[True, True, False], [True, True, True]]).view(2, 1, 1, 3)
    padded = cuda_graphs.pad_decode_inputs(
        torch.tensor([7, 9]), torch.tensor([3, 0]), torch.tensor([[1], [2]]), mask, 4, 5, scratch_row=6
    )
    assert padded.tokens.view(-1).tolist() == [7, 9, 0, 0]
    assert padded.rows.tolist() == [3, 0, 6, 6]
    assert padded.positions.view(-1).tolist() == [1, 2, 0, 0]
    assert padded.mask.view(4, 5).tolist() == [
        [True, True, False, False, False],
        [True, True, True, False, False],
        [True, False, False, False, False],
        [True, False, False, False, False],
    ]
    with pytest.raises(ValueError, match="does not fit the bucket"):
        cuda_graphs.pad_decode_inputs(torch.tensor([1, 2]), torch.tensor([0, 1]), torch.zeros(2, 1), mask, 1, 5, 6)


def test_a_padded_bucketed_step_gives_the_eager_steps_logits(any_pair: tuple[Path, Path]) -> None:
    """What a graph replays, run eagerly on any device: the rows' logits equal the unpadded step's."""
    loaded = load_checkpoint(any_pair[0])
    runner = DraftRunner(loaded, cuda_graphs="off")
    states = [runner.new_state(None) for _ in range(3)]
    runner.propose_batch(
        [DraftRequest(s, p, 1, GREEDY, 4) for s, p in zip(states, [[5, 6, 7], [8], [9, 10]], strict=True)]
    )
    pool = runner._slot_pool()
    scratch = pool.take()
    pool.reserve(300)
    slots = [s.slot for s in states]
    rows = pool.rows_of(slots)
    cached = [len(s.cached) for s in states]
    tokens = torch.tensor([11, 12, 13])
    inputs = kvcache.step_inputs([[11], [12], [13]], rows, cached, [1, 1, 1], loaded.device)
    assert inputs.positions is not None and inputs.mask is not None
    with torch.inference_mode():
        eager = loaded.model(
            input_ids=tokens.unsqueeze(1),
            **kvcache.with_cache(pool.step_cache(slots, cached, [1, 1, 1], inputs)),
            **inputs.model_kwargs(),
        ).logits[:, -1]
        length = cuda_graphs.length_bucket(inputs.mask.shape[-1], pool.capacity)
        assert length is not None
        padded = cuda_graphs.pad_decode_inputs(
            tokens, inputs.rows, inputs.positions, inputs.mask, 4, length, pool.rows_of([scratch])[0]
        )
        cache = pool.static_step_cache(padded.rows, padded.positions, length)
        bucketed = loaded.model(
            input_ids=padded.tokens,
            attention_mask=padded.mask,
            position_ids=padded.positions,
            **kvcache.with_cache(cache),
        ).logits[:3, -1]
    torch.testing.assert_close(bucketed, eager, rtol=1e-5, atol=1e-5)


def _propose_side_by_side(eager: DraftRunner, other: DraftRunner, batches: tuple[int, ...]) -> None:
    """For each batch size, fresh sessions drafted by both runners for three greedy rounds of gamma 4 (each round
    commits the eager draft's first proposal and one more token): the proposals must be the same."""
    for batch in batches:
        prompts = [[5 + i, 6, 7 + 2 * i] for i in range(batch)]
        a = [eager.new_state(None) for _ in prompts]
        b = [other.new_state(None) for _ in prompts]
        for _ in range(3):
            one = eager.propose_batch([DraftRequest(s, p, 4, GREEDY, 4) for s, p in zip(a, prompts, strict=True)])
            two = other.propose_batch([DraftRequest(s, p, 4, GREEDY, 4) for s, p in zip(b, prompts, strict=True)])
            assert [p.token_ids for p in one] == [p.token_ids for p in two]
            prompts = [[p.token_ids[0], 1] for p in one]


def test_a_draft_with_padded_bucketed_steps_proposes_what_the_eager_draft_does(any_pair: tuple[Path, Path]) -> None:
    """What the draft's graphs replay, run eagerly on any device: the same proposals as eager decoding, and every
    decoding pass goes through a bucket, also while the sessions are far shorter than one bucket (the pool grows
    to the bucket; reserved just long enough for them, it would make every pass run eagerly)."""
    eager = DraftRunner(load_checkpoint(any_pair[0]), cuda_graphs="off", ahead="off")
    padded = DraftRunner(load_checkpoint(any_pair[0]), cuda_graphs="off", ahead="off")
    padded._graphs = cuda_graphs.DecodeGraphs(padded.loaded.model, padded._slot_pool(), capture=False)
    replays: list[bool] = []
    step_logits = padded._graphs.step_logits

    def counted(*args: torch.Tensor, keep: int) -> torch.Tensor | None:
        out = step_logits(*args, keep=keep)
        replays.append(out is not None)
        return out

    padded._graphs.step_logits = counted  # type: ignore[method-assign]
    _propose_side_by_side(eager, padded, (1, 3))
    assert len(replays) == 2 * 3 * 3 and all(replays)  # gamma 4: three decoding passes after the first


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device; none is visible")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_drafting_equals_eager_drafting_on_cuda(any_pair: tuple[Path, Path], dtype: str) -> None:
    """The same sessions drafted with graphs and without, for every batch bucket up to 8: fp32 gives the same
    tokens; bf16 the same tokens too on this pair (its logits agree within the capture check's tolerance)."""
    eager = DraftRunner(load_checkpoint(any_pair[0], "cuda", dtype), cuda_graphs="off")
    graphed = DraftRunner(load_checkpoint(any_pair[0], "cuda", dtype), cuda_graphs="on")
    _propose_side_by_side(eager, graphed, (1, 2, 3, 8))
    assert graphed._graphs is not None and not graphed._graphs.disabled
    assert graphed.graph_captures >= len(graphed._graphs._graphs) >= 1 and eager.graph_captures == 0


@pytest.mark.skipif(CUDA, reason="checks the refusal where no CUDA device is visible")
def test_the_draft_refuses_cuda_graphs_on_without_cuda(
    random_pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from starsd.cli import main

    assert main(["draft", "--model", str(random_pair[0]), "--port", "0", "--cuda-graphs", "on"]) == 2
    assert "--cuda-graphs on needs a CUDA device" in capsys.readouterr().err


def test_a_wide_steps_padding_rows_write_their_own_scratch_columns() -> None:
    """A verify step feeds W positions a row: the padding rows write columns 0..W-1 of the scratch slot (no two
    writes to one column), attend column 0 only, and the real rows keep their tokens, columns and mask."""
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True], [True, True, True]])
    mask = mask.view(2, 1, 2, 3)
    padded = cuda_graphs.pad_step_inputs(
        torch.tensor([[7, 8], [0, 9]]),
        torch.tensor([3, 1]),
        torch.tensor([[1, 2], [0, 2]]),
        torch.tensor([[1, 2], [3, 2]]),
        mask,
        4,
        4,
        scratch_row=5,
    )
    assert padded.tokens.tolist() == [[7, 8], [0, 9], [0, 0], [0, 0]]
    assert padded.rows.tolist() == [3, 1, 5, 5]
    assert padded.positions.tolist() == [[1, 2], [0, 2], [0, 0], [0, 0]]
    assert padded.columns.tolist() == [[1, 2], [3, 2], [0, 1], [0, 1]]
    assert padded.mask[:2, :, :, :3].equal(mask) and not padded.mask[:2, :, :, 3].any()
    assert padded.mask[2:].view(2, 2, 4).tolist() == [[[True, False, False, False]] * 2] * 2


def test_the_capture_check_allows_a_unit_in_the_last_place_of_the_logits_scale() -> None:
    """bf16 keeps 8 significand bits: at logits up to 12 one unit in the last place is 0.0625, so a replay that
    differs by 0.0547 (one rounding of a logit) passes; small logits keep the dtype's absolute floor."""
    assert cuda_graphs.check_tolerance(torch.bfloat16, 12.0) == 0.0625 >= 0.0547
    assert cuda_graphs.check_tolerance(torch.bfloat16, 40.0) == 0.25
    assert cuda_graphs.check_tolerance(torch.bfloat16, 1.5) == 3e-2  # 1 ulp = 0.0078: the floor holds
    assert cuda_graphs.check_tolerance(torch.float32, 30.0) == 1e-4  # fp32: 1 ulp at 30 is 2e-6
    assert cuda_graphs.check_tolerance(torch.float16, float("nan")) == 1e-2


def _verify_rounds(runner: TargetRunner, prompts: list[list[int]], refs: list[list[int]], rounds: int) -> list:
    """Greedy rounds verifying the reference continuation as drafts (row 1's third draft wrong, row 2 drafting
    3 where the others draft 4): every round's outcomes."""
    sessions = [runner.new_session(p) for p in prompts]
    runner.step([StepRow(s, prefill=len(p) - 1) for s, p in zip(sessions, prompts, strict=True) if len(p) > 1])
    done = [0] * len(prompts)
    steps = []
    for _ in range(rounds):
        rows = []
        for i, s in enumerate(sessions):
            drafts = list(refs[i][done[i] : done[i] + (3 if i == 2 else 4)])
            if i == 1 and len(drafts) > 2:
                drafts[2] = (drafts[2] + 1) % runner.loaded.vocab_size
            rows.append(StepRow(s, drafts=drafts, params=GREEDY, logprobs=2))
        outcomes = runner.step(rows)
        for i, o in enumerate(outcomes):
            done[i] += len(o.tokens)
        steps.append(outcomes)
    return steps


def test_a_padded_bucketed_target_step_gives_the_eager_steps_logits_and_verdicts(
    any_pair: tuple[Path, Path],
) -> None:
    """What a target graph replays (padded to a bucket, from static inputs), run eagerly on any device: the
    verdicts equal the eager step's, the log-probabilities agree, and both emit the target's own greedy text."""
    loaded = load_checkpoint(any_pair[1])
    prompts = [[5, 17, 42], [9], [3, 3, 8, 21, 2]]
    refs = [autoregressive_reference(loaded, p, 24) for p in prompts]
    eager = TargetRunner(loaded, cuda_graphs="off")
    padded = TargetRunner(loaded, cuda_graphs="off")
    padded._graphs = cuda_graphs.StepGraphs(loaded.model, padded.pool, role="target", capture=False)
    replays: list[int] = []
    step_logits = padded._graphs.step_logits

    def counted(*args: torch.Tensor | int) -> torch.Tensor | None:
        out = step_logits(*args)  # type: ignore[arg-type]
        replays.append(out is not None)
        return out

    padded._graphs.step_logits = counted  # type: ignore[method-assign]
    one = _verify_rounds(eager, prompts, refs, 4)
    two = _verify_rounds(padded, prompts, refs, 4)
    assert replays and all(replays)  # every verify pass went through the padded bucket
    assert [[(o.accepted, o.tokens) for o in s] for s in one] == [[(o.accepted, o.tokens) for o in s] for s in two]
    for s_one, s_two in zip(one, two, strict=True):
        for a, b in zip(s_one, s_two, strict=True):
            assert a.logprobs is not None and b.logprobs is not None
            assert [e.logprob for e in b.logprobs] == pytest.approx([e.logprob for e in a.logprobs], abs=1e-5)
            assert [[t for t, _ in e.top] for e in b.logprobs] == [[t for t, _ in e.top] for e in a.logprobs]
    for i, ref in enumerate(refs):
        emitted = [t for s in two for t in s[i].tokens]
        assert emitted == ref[: len(emitted)] and len(emitted) >= 4
    assert any(o.accepted == 4 for s in two for o in s) and any(o.accepted == 2 for s in two for o in s[1:2])


@pytest.mark.skipif(CUDA, reason="checks the refusal where no CUDA device is visible")
def test_the_target_refuses_cuda_graphs_on_without_cuda(
    random_pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from starsd.cli import main

    argv = ["target", "--model", str(random_pair[1]), "--port", "0", "--cuda-graphs", "on"]
    assert main([*argv, "--draft", "127.0.0.1:1"]) == 2
    assert "--cuda-graphs on needs a CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device; none is visible")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_verification_equals_eager_verification_on_cuda(any_pair: tuple[Path, Path], dtype: str) -> None:
    """The same greedy rounds verified with target graphs and without: the same verdicts and tokens, the capture
    checks pass (no fallback), and the log-probabilities agree within the dtype's noise."""
    prompts = [[5, 17, 42], [9], [3, 3, 8, 21, 2]]
    reference = load_checkpoint(any_pair[1], "cuda", "float32")
    refs = [autoregressive_reference(reference, p, 24) for p in prompts]
    eager = TargetRunner(load_checkpoint(any_pair[1], "cuda", dtype), cuda_graphs="off")
    graphed = TargetRunner(load_checkpoint(any_pair[1], "cuda", dtype), cuda_graphs="on")
    one = _verify_rounds(eager, prompts, refs, 4)
    two = _verify_rounds(graphed, prompts, refs, 4)
    assert graphed._graphs is not None and not graphed._graphs.disabled and graphed._graphs._graphs
    assert graphed.graph_captures >= len(graphed._graphs._graphs) and eager.graph_captures == 0
    assert [[(o.accepted, o.tokens) for o in s] for s in one] == [[(o.accepted, o.tokens) for o in s] for s in two]
    tolerance = 1e-4 if dtype == "float32" else 5e-2
    for s_one, s_two in zip(one, two, strict=True):
        for a, b in zip(s_one, s_two, strict=True):
            assert a.logprobs is not None and b.logprobs is not None
            assert [e.logprob for e in b.logprobs] == pytest.approx([e.logprob for e in a.logprobs], abs=tolerance)


def test_a_bounded_pool_gives_up_the_graphs_scratch_slot_rather_than_fail_a_step(
    random_pair: tuple[Path, Path],
) -> None:
    """Sessions that fit the pool's bound only without the graphs' scratch slot: the step runs, eagerly, and
    gives what a runner without graphs gives."""
    loaded = load_checkpoint(random_pair[1])
    prompts = [[5, 17, 42, 7, 9, 11, 13, 2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1, 12]]
    outcomes = []
    for graphs in (False, True):
        runner = TargetRunner(loaded, kv_tokens=2 * 16, cuda_graphs="off")
        if graphs:
            runner._graphs = cuda_graphs.StepGraphs(loaded.model, runner.pool, role="target", capture=False)
            assert runner.pool.used == 1  # the scratch slot
        sessions = [runner.new_session(p) for p in prompts]
        outcomes.append([o.tokens for o in runner.step([StepRow(s, drafts=[3, 4], params=GREEDY) for s in sessions])])
        assert runner._graphs is None and runner.pool.used == 2
    assert outcomes[0] == outcomes[1]
