"""A request's logit changes (top_k, min_tokens, penalties, logit_bias) at each verified position of a round,
and the losslessness that follows: speculative rounds verified against the changed target distribution produce
exactly that distribution, though the draft proposes from its own, unchanged one."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
import torch

from starsd.sampling import sample, target_generator, verify
from starsd.verifier.processing import (
    LogitRules,
    PenaltyCounts,
    apply_rules,
    generated_counts,
    round_processor,
)
from tests.stats import fits


def reference_rules(logits: torch.Tensor, rules: LogitRules, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """One position, token by token, as vLLM's documentation states the rules (the test's oracle)."""
    out = logits.clone().float()
    for t, b in rules.logit_bias.items():
        out[t] += b
    if len(generated) < rules.min_tokens:
        for t in rules.end_ids:
            out[t] = float("-inf")
    for t in range(out.shape[0]):
        count = generated.count(t)
        if count or t in prompt:
            out[t] = out[t] / rules.repetition_penalty if out[t] > 0 else out[t] * rules.repetition_penalty
        out[t] -= rules.frequency_penalty * count + (rules.presence_penalty if count else 0.0)
    if rules.top_k:
        kth = sorted(out.tolist(), reverse=True)[rules.top_k - 1]
        out[out < kth] = float("-inf")
    return out


def test_each_verified_position_sees_the_drafts_before_it_as_generated() -> None:
    torch.manual_seed(0)
    vocab = 12
    logits = torch.randn(4, vocab) * 3
    rules = LogitRules(
        top_k=6,
        min_tokens=4,
        end_ids=(1,),
        logit_bias={3: 2.0, 4: -5.0},
        presence_penalty=0.7,
        frequency_penalty=0.4,
        repetition_penalty=1.3,
    )
    prompt, generated, drafts = [5, 6], [7, 7, 2], [2, 9, 7]
    changed = apply_rules(logits, rules, prompt, generated, drafts)
    for j in range(4):
        expected = reference_rules(logits[j], rules, prompt, generated + drafts[:j])
        assert torch.allclose(changed[j], expected, atol=1e-5), j
    assert changed[0, 1] == float("-inf") and changed[1, 1] != float("-inf")  # min_tokens: 3 + 0 < 4 <= 3 + 1
    assert generated_counts([7, 7], [7, 3], vocab, torch.device("cpu"))[:, 7].tolist() == [2.0, 3.0, 3.0]
    assert round_processor(LogitRules(), prompt, generated, drafts) is None  # nothing to change: no work


def test_speculative_rounds_produce_exactly_the_changed_distribution() -> None:
    """Two tokens from a small model whose logits depend only on the position, with penalties that depend on the
    first token: the joint distribution of (t1, t2) must be p'(t1) p'(t2 | t1), whatever the draft proposes."""
    vocab = 5
    torch.manual_seed(3)
    table = torch.randn(2, vocab) * 1.5  # the target's logits at output positions 0 and 1
    q = torch.softmax(torch.randn(1, vocab), dim=-1)  # the draft's (unchanged, wrong) proposal
    rules = LogitRules(
        top_k=4, logit_bias={0: 1.0}, presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=1.5
    )
    prompt = [2]

    def changed_probs(position: int, generated: list[int]) -> torch.Tensor:
        return torch.softmax(apply_rules(table[position : position + 1], rules, prompt, generated, [])[0], dim=-1)

    expected = [
        float(changed_probs(0, [])[a] * changed_probs(1, [a])[b]) for a, b in itertools.product(range(vocab), repeat=2)
    ]
    gen = target_generator(17)
    counts = [0] * (vocab * vocab)
    for _ in range(6_000):
        d1 = sample(q[0], gen)
        p = torch.softmax(apply_rules(table, rules, prompt, [], [d1]), dim=-1)  # both positions, d1 as generated
        tokens = verify([d1], q[:1], p, gen).tokens
        if len(tokens) == 1:  # d1 rejected: the next round decodes position 1 after the recovered token
            tokens = [*tokens, sample(changed_probs(1, tokens), gen)]
        counts[tokens[0] * vocab + tokens[1]] += 1
    assert fits(counts, expected)
    unchanged = [
        float(torch.softmax(table[0], -1)[a] * torch.softmax(table[1], -1)[b])
        for a, b in itertools.product(range(vocab), repeat=2)
    ]
    assert not fits(counts, unchanged)  # the test can tell the changed distribution from the model's own


def test_device_counts_follow_a_multi_round_completion_exactly() -> None:
    """Counts kept incrementally (one scatter-add per round) equal counts recomputed from scratch before every
    round, and the changed logits are bit-identical either way."""
    torch.manual_seed(1)
    vocab = 16
    rules = LogitRules(presence_penalty=0.6, frequency_penalty=-0.3, repetition_penalty=1.4, top_k=9)
    prompt = [3, 3, 11]
    penalty = PenaltyCounts(prompt, vocab, torch.device("cpu"))
    generated: list[int] = []
    rounds = [([4, 4, 9], [4, 4]), ([], [0]), ([9, 3, 9, 1], [9, 3, 9, 1, 4]), ([15], [2]), ([4, 2], [4, 2, 2])]
    for drafts, committed in rounds:
        expected = [float(generated.count(t)) for t in range(vocab)]
        assert penalty.counts.tolist() == expected
        assert torch.equal(penalty.round_counts(drafts), generated_counts(generated, drafts, vocab, penalty.device))
        logits = torch.randn(len(drafts) + 1, vocab) * 4
        incremental = round_processor(rules, prompt, generated, drafts, penalty)
        scratch = round_processor(rules, prompt, generated, drafts)
        assert incremental is not None and scratch is not None
        assert torch.equal(incremental(logits), scratch(logits))  # bit-identical, not merely close
        generated += committed
        penalty.add(committed)
    assert penalty.counts[4] == 4 and penalty.counts[9] == 2 and penalty.counts[11] == 0


def test_the_engine_keeps_a_penalised_completions_counts_on_its_device(
    random_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real multi-round completion with penalties: before every round the engine's device counts equal the
    counts recomputed from the tokens generated so far; the output is the one the counts from scratch give."""
    from starsd.checkpoints import load_checkpoint
    from starsd.sampling import SamplingParams
    from starsd.verifier import engine as engine_module
    from starsd.verifier.engine import GenerationStats, RequestControls, TargetEngine

    target = load_checkpoint(random_pair[1])
    vocab = target.vocab_size
    checked: list[int] = []
    PROMPT = [5, 17, 42, 7, 99]

    def checking(rules, prompt, generated, drafts, penalty=None):  # type: ignore[no-untyped-def]
        assert penalty is not None
        assert torch.equal(penalty.round_counts(drafts), generated_counts(generated, drafts, vocab, penalty.device))
        checked.append(len(generated))
        return round_processor(rules, prompt, generated, drafts, penalty)

    controls = RequestControls(ignore_eos=True, presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.3)

    def run(engine: TargetEngine) -> list[int]:
        async def go() -> list[int]:
            stats = GenerationStats()
            async for _ in engine.generate(PROMPT, 12, SamplingParams(), stats, controls=controls):
                pass
            return stats.token_ids

        return asyncio.run(go())

    engine = TargetEngine(target, draft=None)
    try:
        monkeypatch.setattr(engine_module, "round_processor", checking)
        incremental = run(engine)
        monkeypatch.setattr(
            engine_module, "round_processor", lambda r, p, g, d, penalty=None: round_processor(r, p, g, d)
        )
        scratch = run(engine)
    finally:
        engine.close()
    assert checked == list(range(12))  # one check per round, each after all the tokens before it
    assert incremental == scratch and len(set(incremental)) > 1
