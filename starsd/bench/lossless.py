"""Lossless on a device, measured: speculative greedy decoding through StarSD's own runners against the target
alone, and what low precision does to it (see docs/architecture.md, "Lossless on a GPU, defined and tested").

* :func:`speculative_greedy` decodes many prompts at once the way the servers do: the draft proposes for every
  session in one :meth:`DraftRunner.propose_batch`, the target verifies every session in one
  :meth:`TargetRunner.step`. :func:`target_alone` decodes each prompt by itself, one token per step.
* In fp32 the two are identical (the contract, held by the tests). In bf16 a batch's composition changes logits
  in the last bits, so :func:`greedy_probe` reports the match rate and re-runs each speculative output through
  the target in one plain forward pass: every emitted token must be within :func:`logit_tolerance` of the top
  logit at its position (a near-tie decided the other way, never a wrong token).
* :func:`self_draft_probe` drafts with the target's own weights: every proposal should be accepted, so each
  rejection is numerical noise between the draft's and the target's forward passes; it reports their rate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

TOLERANCE_ULPS = 4  # bf16 units in the last place of the top logit (see logit_tolerance)


def logit_tolerance(top: float, dtype_bits: int = 8) -> float:
    """How far below the top logit an emitted token's logit may be: ``TOLERANCE_ULPS`` units in the last place of
    the top logit in a format with ``dtype_bits`` significand bits (bf16: 8, so 4 ulps of a logit of 10 = 0.25)."""
    exponent = math.floor(math.log2(abs(top))) if top else -126
    return TOLERANCE_ULPS * 2.0 ** (exponent - (dtype_bits - 1))


def speculative_greedy(
    draft: Any, target: Any, prompts: list[list[int]], max_tokens: int, gamma: int
) -> tuple[list[list[int]], int, int]:
    """Greedy speculative decoding of every prompt together: ``(outputs, drafted, accepted)``."""
    from starsd.proposals import DraftRequest, SamplingParams
    from starsd.verifier.runner import StepRow

    sessions = [target.new_session(p) for p in prompts]
    states = [draft.new_state(seed=None) for _ in prompts]
    target.step([StepRow(s, prefill=len(p) - 1) for s, p in zip(sessions, prompts, strict=True) if len(p) > 1])
    new = [list(p) for p in prompts]  # what the draft has not seen yet
    outs: list[list[int]] = [[] for _ in prompts]
    drafted = accepted = 0
    while True:
        live = [i for i in range(len(prompts)) if len(outs[i]) < max_tokens]
        if not live:
            break
        gammas = [min(gamma, max_tokens - len(outs[i]) - 1) for i in live]
        requests = [DraftRequest(states[i], new[i], g, SamplingParams(), 0) for i, g in zip(live, gammas, strict=True)]
        proposals = draft.propose_batch(requests)
        outcomes = target.step([StepRow(sessions[i], drafts=p.token_ids) for i, p in zip(live, proposals, strict=True)])
        for i, p, o in zip(live, proposals, outcomes, strict=True):
            outs[i].extend(o.tokens)
            new[i] = list(o.tokens)
            drafted += len(p.token_ids)
            accepted += o.accepted
    for s in sessions:
        target.release(s)
    return [o[:max_tokens] for o in outs], drafted, accepted


def target_alone(target: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding of one prompt by the target runner alone: one row, one token per step."""
    from starsd.verifier.runner import StepRow

    session = target.new_session(prompt)
    if len(prompt) > 1:
        target.step([StepRow(session, prefill=len(prompt) - 1)])
    out: list[int] = []
    while len(out) < max_tokens:
        out.extend(target.step([StepRow(session)])[0].tokens)
    target.release(session)
    return out


def logit_gaps(loaded: Any, prompt: list[int], output: list[int]) -> list[tuple[float, float]]:
    """``(top logit - emitted token's logit, top logit)`` at each emitted position, from one plain forward pass
    of the target over ``prompt + output`` (no cache, no batch)."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt + output], device=loaded.device)
        logits = loaded.model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(output)].float()
        emitted = logits.gather(-1, torch.tensor(output, device=loaded.device).unsqueeze(-1)).squeeze(-1)
        top = logits.max(dim=-1).values
        return list(zip((top - emitted).tolist(), top.tolist(), strict=True))


@dataclass
class GreedyProbe:
    """Speculative greedy decoding of several prompts at once against the target alone."""

    dtype: str
    prompts: int
    tokens: int  # emitted per prompt
    identical_outputs: int  # prompts whose speculative output equals the target alone's
    match_rate: float  # tokens equal to the target alone's, before each output's first difference, over all
    acceptance: float  # accepted / drafted
    max_gap: float  # the largest (top logit - emitted logit) on re-running the speculative outputs
    over_tolerance: int  # emitted tokens further than logit_tolerance from their position's top logit
    tolerance_ulps: int = TOLERANCE_ULPS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def greedy_probe(
    draft_loaded: Any, target_loaded: Any, prompts: list[list[int]], max_tokens: int, gamma: int
) -> GreedyProbe:
    """Decode ``prompts`` speculatively (all at once) and each alone through the target; compare (see above)."""
    from starsd.draft.runner import DraftRunner
    from starsd.verifier.runner import TargetRunner

    target = TargetRunner(target_loaded)
    outs, drafted, accepted = speculative_greedy(DraftRunner(draft_loaded), target, prompts, max_tokens, gamma)
    alone = [target_alone(TargetRunner(target_loaded), p, max_tokens) for p in prompts]
    matched = 0
    for out, ref in zip(outs, alone, strict=True):
        first_difference = next((j for j, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b), len(out))
        matched += first_difference
    gaps = [g for p, out in zip(prompts, outs, strict=True) for g in logit_gaps(target_loaded, p, out)]
    bits = (
        8
        if "bfloat16" in str(target_loaded.placement.dtype)
        else 11
        if "float16" in str(target_loaded.placement.dtype)
        else 24
    )
    return GreedyProbe(
        dtype=str(target_loaded.placement.dtype).removeprefix("torch."),
        prompts=len(prompts),
        tokens=max_tokens,
        identical_outputs=sum(a == b for a, b in zip(outs, alone, strict=True)),
        match_rate=round(matched / max(1, sum(len(o) for o in outs)), 6),
        acceptance=round(accepted / max(1, drafted), 6),
        max_gap=round(max((gap for gap, _ in gaps), default=0.0), 6),
        over_tolerance=sum(gap > logit_tolerance(top, bits) for gap, top in gaps),
    )


def self_draft_probe(target_loaded: Any, prompts: list[list[int]], max_tokens: int, gamma: int) -> dict[str, Any]:
    """Draft with the target's own weights: the rejection rate is the numerical noise between the passes."""
    from starsd.draft.runner import DraftRunner
    from starsd.verifier.runner import TargetRunner

    _, drafted, accepted = speculative_greedy(
        DraftRunner(target_loaded), TargetRunner(target_loaded), prompts, max_tokens, gamma
    )
    return {
        "dtype": str(target_loaded.placement.dtype).removeprefix("torch."),
        "drafted": drafted,
        "accepted": accepted,
        "rejection_rate": round(1 - accepted / max(1, drafted), 6),
    }
