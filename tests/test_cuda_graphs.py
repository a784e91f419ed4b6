"""CUDA graphs of the draft's decoding step: the bucket arithmetic and the padded step (on any device), the
capture and replay (on CUDA only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from starsd import cuda_graphs, kvcache
from starsd.checkpoints import load_checkpoint
from starsd.draft.runner import DraftRunner
from starsd.proposals import DraftRequest
from starsd.sampling import SamplingParams

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


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device; none is visible")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_drafting_equals_eager_drafting_on_cuda(any_pair: tuple[Path, Path], dtype: str) -> None:
    """The same sessions drafted with graphs and without, for every batch bucket up to 8: fp32 gives the same
    tokens; bf16 the same tokens too on this pair (its logits agree within the capture check's tolerance)."""
    eager = DraftRunner(load_checkpoint(any_pair[0], "cuda", dtype), cuda_graphs="off")
    graphed = DraftRunner(load_checkpoint(any_pair[0], "cuda", dtype), cuda_graphs="on")
    for batch in (1, 2, 3, 8):
        prompts = [[5 + i, 6, 7 + 2 * i] for i in range(batch)]
        a = [eager.new_state(None) for _ in prompts]
        b = [graphed.new_state(None) for _ in prompts]
        for _ in range(3):
            one = eager.propose_batch([DraftRequest(s, p, 4, GREEDY, 4) for s, p in zip(a, prompts, strict=True)])
            two = graphed.propose_batch([DraftRequest(s, p, 4, GREEDY, 4) for s, p in zip(b, prompts, strict=True)])
            assert [p.token_ids for p in one] == [p.token_ids for p in two]
            prompts = [[p.token_ids[0], 1] for p in one]
    assert graphed._graphs is not None and not graphed._graphs.disabled


@pytest.mark.skipif(CUDA, reason="checks the refusal where no CUDA device is visible")
def test_the_draft_refuses_cuda_graphs_on_without_cuda(
    random_pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from starsd.cli import main

    assert main(["draft", "--model", str(random_pair[0]), "--port", "0", "--cuda-graphs", "on"]) == 2
    assert "--cuda-graphs on needs a CUDA device" in capsys.readouterr().err
