"""The target's generation loop: ask the draft, verify in one forward pass, commit ``l + 1`` tokens.

Many completions run concurrently on one event loop; model work runs on one worker thread, so one
completion's verification overlaps other completions' round trips to the draft (pipelining).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from starsd.runners import LoadedModel, TargetRunner, TargetSession
from starsd.sampling import SamplingParams, Verdict, dense_from_sparse, target_generator, verify, verify_greedy
from starsd.seeding import request_seed
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


# Given the tokens generated before a round and the round's tokens, how many of the round's tokens to keep
# because a stop sequence ends within them (None: no stop sequence ends there).
StopCheck = Callable[[list[int], list[int]], int | None]


def kept_counts(verdict: Verdict, drafted: int, keep: int) -> tuple[int, int]:
    """(drafted, accepted) of a round of which only the first ``keep`` tokens count (EOS or a stop inside it).

    The round's tokens are the accepted drafts then one target token; drafts past the cut were never needed,
    so they count neither as drafted nor as accepted.
    """
    if keep > verdict.accepted:
        return drafted, verdict.accepted
    return keep, keep


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
        self,
        prompt: list[int],
        max_tokens: int,
        params: SamplingParams,
        stats: GenerationStats,
        stop: StopCheck | None = None,
    ) -> AsyncGenerator[list[int], None]:
        """Yield the tokens committed by each round (EOS excluded) until ``max_tokens``, EOS or a stop sequence."""
        loop = asyncio.get_running_loop()
        session = self.runner.new_session(prompt)
        seed = request_seed(params.seed)
        generator = None if params.greedy else target_generator(seed)
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
                    elif link.malformed:
                        self.metrics.malformed_proposals.inc()
                        link.malformed = False
                rnd = await loop.run_in_executor(
                    self.executor, self._round, session, proposal, gamma, params, generator
                )
                verify_seconds = rnd.verify_seconds
                if proposal is not None and link is not None:
                    link.acceptance.update(rnd.verdict.accepted, rnd.drafted)
                tokens = rnd.verdict.tokens
                keep = len(tokens)  # tokens of this round that count (through an EOS or a stop sequence)
                if eos is not None and eos in tokens:
                    keep = tokens.index(eos) + 1
                    tokens = tokens[: keep - 1]
                    stats.finish_reason = "stop"
                cut = stop(stats.token_ids, tokens) if stop is not None and tokens else None
                if cut is not None:
                    keep = cut
                    tokens = tokens[:cut]
                    stats.finish_reason = "stop"
                drafted, accepted = kept_counts(rnd.verdict, rnd.drafted, keep)
                stats.rounds += 1
                stats.drafted_tokens += drafted
                stats.accepted_tokens += accepted
                if proposal is None and link is not None and gamma > 0:  # wanted a draft, had none
                    stats.fallback_tokens += len(tokens)
                    self.metrics.fallback_tokens.inc(len(tokens))
                self.metrics.rounds.inc()
                self.metrics.draft_tokens.inc(drafted)
                self.metrics.accepted_tokens.inc(accepted)
                self.metrics.verify_seconds.observe(rnd.verify_seconds)
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
