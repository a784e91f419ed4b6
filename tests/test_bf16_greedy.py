"""Greedy decoding in bfloat16 on the CPU, speculative against the target alone (DESIGN.md section 10).

In bf16 the logits of one position change in their last bits with the shape of the pass that computes them
(a round verifies ``gamma + 1`` positions where decoding alone feeds one), so greedy identity is reported as a
match rate, and what is asserted is the contract's tolerance: re-run through the target in one plain forward
pass, every emitted token's logit is within :data:`starsd.bench.lossless.TOLERANCE_ULPS` (4) bf16 units in
the last place of its position's top logit, and wherever the two outputs first differ, both tokens are such
near-ties. In float32 the same harness must give identical output (the check of the harness itself).

Both sides run the same batch: the same eight prompts stepped together by the real :class:`TargetRunner`
(with the real :class:`DraftRunner` proposing ``GAMMA`` tokens per round on the speculative side).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from starsd.bench.lossless import logit_tolerance
from starsd.checkpoints import LoadedModel, load_checkpoint
from tests.support.speculation import Decoding, run_completions

GAMMA = 4
MAX_TOKENS = 32
GREEDY = Decoding(temperature=0.0)
PROMPTS = [
    "def __init__(self",
    "import os\nimport sys\n",
    "class Parser:\n    def parse(self, text):\n",
    "for i in range(",
    "    return self._",
    'if __name__ == "__main__":\n',
    "try:\n    import ",
    "from collections import ",
]


def greedy_pair(pair: tuple[Path, Path], dtype: str) -> tuple[list[list[int]], list[list[int]], LoadedModel]:
    draft = load_checkpoint(pair[0], device="cpu", dtype=dtype)
    target = load_checkpoint(pair[1], device="cpu", dtype=dtype)
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    seeds: list[int | None] = [None] * len(prompts)
    speculative = run_completions(draft, target, prompts, MAX_TOKENS, GAMMA, GREEDY, seeds, batch=len(prompts))
    alone = run_completions(None, target, prompts, MAX_TOKENS, 0, GREEDY, seeds, batch=len(prompts))
    return speculative.tokens, alone.tokens, target


@torch.no_grad()
def gaps(target: LoadedModel, prompt: list[int], out: list[int]) -> list[tuple[float, float]]:
    """``(top logit - emitted token's logit, top logit)`` at each position of ``out``, in one forward pass."""
    ids = torch.tensor([prompt + out[:-1]], device=target.device)
    logits = target.model(input_ids=ids).logits[0, len(prompt) - 1 :].float()  # [len(out), V]
    top = logits.max(dim=-1).values
    emitted = logits.gather(-1, torch.tensor(out).unsqueeze(-1)).squeeze(-1)
    return list(zip((top - emitted).tolist(), top.tolist(), strict=True))


def test_bf16_greedy_matches_the_target_alone_within_the_logit_tolerance(
    shipped_pair: tuple[Path, Path], record_property: pytest.RecordProperty
) -> None:
    speculative, alone, target = greedy_pair(shipped_pair, "bfloat16")
    assert target.model.dtype == torch.bfloat16
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    same = sum(a == b for s, r in zip(speculative, alone, strict=True) for a, b in zip(s, r, strict=True))
    match_rate = same / (len(PROMPTS) * MAX_TOKENS)
    identical = sum(s == r for s, r in zip(speculative, alone, strict=True))
    record_property("bf16_greedy_token_match_rate", round(match_rate, 4))
    record_property("bf16_greedy_identical_completions", f"{identical}/{len(PROMPTS)}")
    for prompt, spec_out, alone_out in zip(prompts, speculative, alone, strict=True):
        for side, out in (("speculative", spec_out), ("alone", alone_out)):
            over = [(j, g, t) for j, (g, t) in enumerate(gaps(target, prompt, out)) if g > logit_tolerance(t)]
            assert not over, f"{side} output of {prompt!r}: (position, gap, top) over tolerance {over}"
        first = next((j for j, (a, b) in enumerate(zip(spec_out, alone_out, strict=True)) if a != b), None)
        if first is not None:  # where the outputs part, the target's top two logits are a near-tie
            ids = torch.tensor([prompt + spec_out[:first]])
            with torch.no_grad():
                logits = target.model(input_ids=ids).logits[0, -1].float()
            top = float(logits.max())
            for token in (spec_out[first], alone_out[first]):
                assert top - float(logits[token]) <= logit_tolerance(top), (prompt, first, token)
    assert match_rate > 0.0, "nothing matched: the two sides do not decode the same model"
    # The tolerance can fail: the target's second choice everywhere is far from its top somewhere.
    with torch.no_grad():
        logits = target.model(input_ids=torch.tensor([prompts[0] + alone[0][:-1]])).logits[0, len(prompts[0]) - 1 :]
    second = logits.float().topk(2).indices[:, 1].tolist()
    assert any(g > logit_tolerance(t) for g, t in gaps(target, prompts[0], second))


def test_float32_greedy_is_identical_to_the_target_alone_in_the_same_harness(shipped_pair: tuple[Path, Path]) -> None:
    speculative, alone, _ = greedy_pair(shipped_pair, "float32")
    assert speculative == alone
