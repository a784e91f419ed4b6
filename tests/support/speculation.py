"""Sampled completions through the real draft and target runners, and the exact oracle they are held to.

:func:`sample_completions` runs completions the way a target server does, in process: a session per request
seed on the real :class:`DraftRunner` (its generator derived from the seed by the draft's own ``new_state``) and
on the real :class:`TargetRunner` (its generator :func:`target_generator` of the seed, as the engine makes it),
``gamma`` drafts per round (fewer near ``max_tokens``, as the engine asks), the request's ``top_k`` through the
engine's own :func:`round_processor`, every round of every live completion verified in one batched step.

:func:`conditional_check` is the oracle, independent of the code under test: the target's exact next-token
probabilities from transformers in float64 (top-k, temperature and top-p written out here, not imported), and
at each position ``j`` of the completions a test of the observed tokens against those probabilities given each
completion's own prefix. The tokens are binned by a function of the prefix (the token's rank under the
target, and whether the draft favours it over the target), so a verifier that leans towards the draft shows;
the binned counts minus their expectations form a martingale whose covariance is known exactly
(``sum_i diag(b_i) - b_i b_i^T``), so the Mahalanobis statistic is chi-square with (bins - 1) degrees of freedom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from starsd import defaults
from starsd.checkpoints import LoadedModel
from starsd.draft.runner import DraftRunner
from starsd.proposals import DraftRequest, SamplingParams
from starsd.sampling import target_generator
from starsd.seeding import request_seed
from starsd.verifier.engine import RequestControls
from starsd.verifier.processing import round_processor
from starsd.verifier.runner import StepRow, TargetRunner
from tests.stats import chi2_critical

RANK_BUCKETS = 4  # the target's top 1, 2, 3 and the rest
BINS = 2 * RANK_BUCKETS  # each split by whether the draft's proposal gives the token more than the target does


@dataclass(frozen=True)
class Decoding:
    """What a request asks for besides its seed."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # the request's top_k (the target's logits); 0: all

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p)


@dataclass
class Completions:
    tokens: list[list[int]]  # per request seed, its max_tokens generated tokens
    first_round: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) of each first round


def sample_completions(
    draft: LoadedModel,
    target: LoadedModel,
    prompt: list[int],
    max_tokens: int,
    gamma: int,
    decoding: Decoding,
    seeds: range,
    batch: int = 512,
    proposal_top_k: int = defaults.PROPOSAL_TOP_K,
) -> Completions:
    """``max_tokens`` tokens after ``prompt`` for each request seed (EOS ignored: a token like any other)."""
    return run_completions(
        draft, target, [prompt] * len(seeds), max_tokens, gamma, decoding, list(seeds), batch, proposal_top_k
    )


def run_completions(
    draft: LoadedModel | None,
    target: LoadedModel,
    prompts: list[list[int]],
    max_tokens: int,
    gamma: int,
    decoding: Decoding,
    seeds: list[int | None],
    batch: int = 512,
    proposal_top_k: int = defaults.PROPOSAL_TOP_K,
) -> Completions:
    """``max_tokens`` tokens for each ``(prompt, seed)``, ``batch`` completions per step (without a draft, or
    with ``gamma`` 0: the target decoding alone, one token per round)."""
    drafter, verifier = (DraftRunner(draft) if draft is not None else None), TargetRunner(target)
    rules = RequestControls(ignore_eos=True, top_k=decoding.top_k).rules(target.eos_token_id)
    params = decoding.params
    out = Completions(tokens=[])
    for start in range(0, len(prompts), batch):
        chunk = [request_seed(s) for s in seeds[start : start + batch]]
        texts = prompts[start : start + batch]
        sessions = [verifier.new_session(p) for p in texts]
        states = [drafter.new_state(seed) for seed in chunk] if drafter is not None else []
        generators = [target_generator(seed, target.device) for seed in chunk]
        generated: list[list[int]] = [[] for _ in chunk]
        unsent = [list(p) for p in texts]  # committed tokens the draft has not been told yet
        first: list[tuple[int, int] | None] = [None] * len(chunk)
        while True:
            live = [b for b in range(len(chunk)) if len(generated[b]) < max_tokens]
            if not live:
                break
            gammas = {b: min(gamma, max_tokens - len(generated[b]) - 1) for b in live}
            asking = [b for b in live if gammas[b] > 0] if drafter is not None else []
            requests = [DraftRequest(states[b], unsent[b], gammas[b], params, proposal_top_k) for b in asking]
            proposals = dict(zip(asking, drafter.propose_batch(requests), strict=True)) if drafter and requests else {}
            for b in asking:
                unsent[b] = []
            rows = []
            for b in live:
                p = proposals.get(b)
                drafts = p.token_ids if p is not None else []
                row = StepRow(sessions[b], list(drafts), params, None if params.greedy else generators[b])
                if p is not None:
                    row.q_ids, row.q_probs = p.q_ids, p.q_probs
                row.process = round_processor(rules, texts[b], generated[b], row.drafts)
                rows.append(row)
            for b, row, outcome in zip(live, rows, verifier.step(rows), strict=True):
                if first[b] is None:
                    first[b] = (len(row.drafts), outcome.accepted)
                generated[b].extend(outcome.tokens)
                unsent[b].extend(outcome.tokens)
        for s in sessions:
            verifier.release(s)
        out.tokens.extend(g[:max_tokens] for g in generated)
        out.first_round.extend(f for f in first if f is not None)
    return out


# --- the oracle -----------------------------------------------------------------------------------------


def float64_model(path: Path) -> Any:
    """The checkpoint at ``path`` in float64, straight from transformers."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float64).eval()


def exact_probs(logits: torch.Tensor, decoding: Decoding) -> torch.Tensor:
    """The distribution ``[..., V]`` the target alone samples from: top-k on the logits, then temperature, then
    top-p (the smallest set of most likely tokens whose mass reaches ``top_p``), in float64."""
    logits = logits.double()
    if decoding.top_k:
        kth = logits.topk(decoding.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits / decoding.temperature, dim=-1)
    if decoding.top_p < 1.0:
        ordered, order = probs.sort(dim=-1, descending=True)
        before = ordered.cumsum(dim=-1) - ordered
        ordered = ordered.masked_fill(before >= decoding.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def proposal_probs(logits: torch.Tensor, decoding: Decoding, top_k: int) -> torch.Tensor:
    """The draft's proposal distribution, as far as binning needs it: temperature, top-p, its top ``top_k``."""
    probs = exact_probs(logits, Decoding(decoding.temperature, decoding.top_p))
    kth = probs.topk(top_k, dim=-1).values[..., -1:]
    probs = probs.masked_fill(probs < kth, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


@torch.no_grad()
def binned(
    target64: Any,
    draft64: Any,
    prompt: list[int],
    tokens: list[list[int]],
    decoding: Decoding,
    proposal_top_k: int = defaults.PROPOSAL_TOP_K,
    chunk: int = 512,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per completion and position: each bin's exact probability ``[N, T, BINS]``, the observed bin ``[N, T]``, and
    how many drawn tokens the target could never have drawn (probability 0: outside top-k or top-p)."""
    n_tokens = len(tokens[0])
    probs_out, seen_out, impossible = [], [], 0
    for start in range(0, len(tokens), chunk):
        seqs = torch.tensor([prompt + t[:-1] for t in tokens[start : start + chunk]])  # [B, L]
        drawn = torch.tensor([t for t in tokens[start : start + chunk]])  # [B, T]
        at = slice(len(prompt) - 1, len(prompt) - 1 + n_tokens)
        p = exact_probs(target64(input_ids=seqs).logits[:, at], decoding)  # [B, T, V]
        q = proposal_probs(draft64(input_ids=seqs).logits[:, at], decoding, proposal_top_k)
        top = p.topk(RANK_BUCKETS - 1, dim=-1).indices  # [B, T, 3]
        ranks = torch.arange(RANK_BUCKETS - 1).expand_as(top)
        rank = torch.full(p.shape, RANK_BUCKETS - 1, dtype=torch.long).scatter_(-1, top, ranks)  # [B, T, V]
        bins = rank + RANK_BUCKETS * (q > p).long()
        bin_probs = torch.zeros(*p.shape[:-1], BINS, dtype=torch.float64).scatter_add_(-1, bins, p)
        probs_out.append(bin_probs)
        seen_out.append(bins.gather(-1, drawn.unsqueeze(-1)).squeeze(-1))
        impossible += int((p.gather(-1, drawn.unsqueeze(-1)) == 0).sum())
    return torch.cat(probs_out), torch.cat(seen_out), impossible


@dataclass(frozen=True)
class PositionResult:
    position: int  # 1-based
    statistic: float
    df: int
    critical: float
    z: list[float]  # per bin, (observed - expected) / sd

    @property
    def fits(self) -> bool:
        return self.statistic < self.critical

    def __str__(self) -> str:
        zs = ", ".join(f"{v:+.1f}" for v in self.z)
        limit = f"{self.df} df, limit {self.critical:.1f}"
        return f"position {self.position}: chi2 {self.statistic:.1f} ({limit}), z [{zs}]"


def position_tests(bin_probs: torch.Tensor, seen: torch.Tensor, p_value: float = 1e-4) -> list[PositionResult]:
    """At each position, the observed bins against their exact expectations (Mahalanobis, chi-square)."""
    results = []
    for j in range(bin_probs.shape[1]):
        b = bin_probs[:, j]  # [N, BINS]
        observed = torch.bincount(seen[:, j], minlength=BINS).double()
        diff = observed - b.sum(dim=0)
        cov = torch.diag(b.sum(dim=0)) - b.T @ b
        keep = cov.diagonal() > 1e-9
        diff, cov = diff[keep][:-1], cov[keep][:, keep][:-1, :-1]  # one bin is implied by the others
        df = int(diff.numel())
        stat = float(diff @ torch.linalg.solve(cov, diff)) if df else 0.0
        sd = cov.diagonal().sqrt()
        z = (diff / sd).tolist()
        results.append(PositionResult(j + 1, stat, max(df, 1), chi2_critical(max(df, 1), p_value), z))
    return results
