"""The target's generation loop: ask the draft, verify in one forward pass, commit ``l + 1`` tokens.

Many completions run concurrently on one event loop; model work runs on one worker thread, so one
completion's verification overlaps other completions' round trips to the draft (pipelining).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from starsd.runners import LoadedModel, TargetRunner, TargetSession
from starsd.sampling import SamplingParams, Verdict, dense_from_sparse, verify, verify_greedy
from starsd.target.draft_client import DraftClient, DraftLink, DraftProposal
from starsd.target.metrics import TargetMetrics


@dataclass
class GenerationStats:
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    fallback_tokens: int = 0
    generated_tokens: int = 0
    finish_reason: str = "length"
    token_ids: list[int] = field(default_factory=list)  # generated ids (EOS excluded)

    def to_json(self) -> dict[str, int]:
        return {
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallback_tokens": self.fallback_tokens,
        }


@dataclass
class Round:
    verdict: Verdict
    drafted: int
    verify_seconds: float


@dataclass
class TargetEngine:
    loaded: LoadedModel
    draft: DraftClient | None
    gamma: int = 4  # tokens drafted per round; with adaptive_gamma, the most a round asks for
    adaptive_gamma: bool = False
    metrics: TargetMetrics = field(default_factory=TargetMetrics)

    def __post_init__(self) -> None:
        self.runner = TargetRunner(self.loaded)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target-model")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _round(
        self,
        session: TargetSession,
        proposal: DraftProposal | None,
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Round:
        """One verify step on the model thread: score, decide, commit."""
        drafts = proposal.token_ids[:gamma] if proposal else []
        start = time.perf_counter()
        logits = self.runner.score(session, drafts)  # [len(drafts) + 1, V]
        if params.greedy:
            verdict = verify_greedy(drafts, logits.argmax(dim=-1).tolist())
        else:
            q = None
            if drafts:
                assert proposal is not None
                ids = torch.tensor(proposal.q_ids[: len(drafts)], dtype=torch.long)
                probs = torch.tensor(proposal.q_probs[: len(drafts)], dtype=torch.float32)
                q = dense_from_sparse(ids, probs, logits.shape[-1])
            verdict = verify(drafts, q, self.runner.probs(logits, params), generator)
        self.runner.commit(session, verdict.accepted, verdict.tokens)
        return Round(verdict, len(drafts), time.perf_counter() - start)

    async def generate(
        self, prompt: list[int], max_tokens: int, params: SamplingParams, stats: GenerationStats
    ) -> AsyncGenerator[list[int], None]:
        """Yield the tokens committed by each round (EOS excluded) until ``max_tokens`` or EOS."""
        loop = asyncio.get_running_loop()
        session = self.runner.new_session(prompt)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(7), "big")
        generator = None if params.greedy else torch.Generator().manual_seed(seed)
        link = DraftLink(self.draft, params, seed) if self.draft else None
        eos = self.loaded.eos_token_id
        verify_seconds = 0.0
        try:
            while stats.generated_tokens < max_tokens:
                remaining = max_tokens - stats.generated_tokens
                gamma = self.gamma
                if self.adaptive_gamma and link is not None:
                    gamma = link.next_gamma(self.gamma, verify_seconds)
                gamma = min(gamma, remaining - 1)  # a round commits up to gamma + 1 tokens
                proposal = None
                if link is not None and gamma > 0:
                    sent = time.perf_counter()
                    proposal = await link.propose(session.committed, gamma, verify_seconds)
                    if proposal is not None:
                        self.metrics.draft_rtt_seconds.observe(time.perf_counter() - sent)
                rnd = await loop.run_in_executor(
                    self.executor, self._round, session, proposal, gamma, params, generator
                )
                verify_seconds = rnd.verify_seconds
                if proposal is not None and link is not None:
                    link.acceptance.update(rnd.verdict.accepted, rnd.drafted)
                tokens = rnd.verdict.tokens
                stats.rounds += 1
                stats.drafted_tokens += rnd.drafted
                stats.accepted_tokens += rnd.verdict.accepted
                if proposal is None and link is not None and gamma > 0:  # wanted a draft, had none
                    stats.fallback_tokens += len(tokens)
                    self.metrics.fallback_tokens.inc(len(tokens))
                self.metrics.rounds.inc()
                self.metrics.draft_tokens.inc(rnd.drafted)
                self.metrics.accepted_tokens.inc(rnd.verdict.accepted)
                self.metrics.verify_seconds.observe(rnd.verify_seconds)
                if eos is not None and eos in tokens:
                    tokens = tokens[: tokens.index(eos)]
                    stats.finish_reason = "stop"
                stats.generated_tokens += len(tokens)
                stats.token_ids.extend(tokens)
                self.metrics.generated_tokens.inc(len(tokens))
                if tokens:
                    yield tokens
                if stats.finish_reason == "stop":
                    return
        finally:
            if link is not None:
                link.release()
