"""The target's generation loop: ask the draft, verify in a batched step, commit ``l + 1`` tokens.

Many completions run concurrently on one event loop. Each one's rounds go to the :class:`StepScheduler`, which
verifies every ready session in one forward pass on the model thread (continuous batching), while the others
wait for their drafts: one completion's verification overlaps other completions' round trips (pipelining).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from starsd import defaults
from starsd.checkpoints import LoadedModel
from starsd.sampling import SamplingParams, target_generator
from starsd.seeding import request_seed
from starsd.verifier.draft_client import Demand, DraftClient, DraftLink, DraftProposal
from starsd.verifier.memory import DEFAULT_GPU_MEMORY_FRACTION, kv_budget_tokens
from starsd.verifier.metrics import TargetMetrics
from starsd.verifier.processing import LogitRules, PenaltyCounts, round_processor
from starsd.verifier.runner import RowOutcome, StepRow, TargetRunner, TargetSession, TokenLogprobs
from starsd.verifier.scheduler import KvBudget, StepScheduler


@dataclass(frozen=True)
class BatchOptions:
    """How much one target runs at once (see starsd.verifier.scheduler)."""

    max_num_seqs: int = defaults.MAX_NUM_SEQS  # sessions in one step, and completions running at once
    kv_cache_tokens: int | None = None  # key/value tokens reserved at most; None: see kv_budget_tokens
    max_prefill_tokens: int = defaults.MAX_PREFILL_TOKENS  # prompt tokens fed per session and step (then chunks)


@dataclass
class GenerationStats:
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    fallback_tokens: int = 0
    generated_tokens: int = 0
    finish_reason: str = "length"
    token_ids: list[int] = field(default_factory=list)  # generated ids (EOS excluded)
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per generated id, when asked for
    first_token_at: float | None = None  # perf_counter() when the first tokens were committed

    def to_json(self) -> dict[str, int]:
        return {
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallback_tokens": self.fallback_tokens,
        }


# Given the tokens generated before a round and the round's tokens, how many of the round's tokens to keep
# because a stop sequence ends within them (None: no stop sequence ends there).
StopCheck = Callable[[list[int], list[int]], int | None]


def kept_counts(verdict: RowOutcome, drafted: int, keep: int) -> tuple[int, int]:
    """(drafted, accepted) of a round of which only the first ``keep`` tokens count (EOS or a stop inside it).

    The round's tokens are the accepted drafts then one target token; drafts past the cut were never needed,
    so they count neither as drafted nor as accepted.
    """
    if keep > verdict.accepted:
        return drafted, verdict.accepted
    return keep, keep


@dataclass(frozen=True)
class RequestControls:
    """A completion's request-level controls besides sampling (vLLM's extras and OpenAI's logprobs)."""

    ignore_eos: bool = False  # EOS is a token like any other
    stop_token_ids: tuple[int, ...] = ()  # these end the completion like EOS (and are not part of its text)
    min_tokens: int = 0  # EOS and the stop tokens are impossible before this many tokens
    top_k: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # report the target's log-probabilities and this many top alternatives

    def end_ids(self, eos: int | None) -> tuple[int, ...]:
        ends = () if self.ignore_eos or eos is None else (eos,)
        return ends + tuple(t for t in self.stop_token_ids if t not in ends)

    def rules(self, eos: int | None) -> LogitRules:
        return LogitRules(
            top_k=self.top_k,
            min_tokens=self.min_tokens,
            end_ids=self.end_ids(eos),
            logit_bias=self.logit_bias,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
        )


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request seeded with ``seed``: the seed itself for the first (so n = 1 is
    reproduced by n = 2's first choice), a digest for the others (independent samples, still reproducible)."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(b"starsd.choice\x00" + seed.to_bytes(8, "big") + index.to_bytes(4, "big"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


def first_end(tokens: list[int], end_ids: tuple[int, ...]) -> int | None:
    """The index of the first token of ``tokens`` that ends the completion, or None."""
    return next((i for i, t in enumerate(tokens) if t in end_ids), None)


@dataclass
class TargetEngine:
    loaded: LoadedModel
    draft: DraftClient | None
    gamma: int = defaults.GAMMA  # tokens drafted per round; with adaptive_gamma, the most a round asks for
    adaptive_gamma: bool = False
    metrics: TargetMetrics = field(default_factory=TargetMetrics)
    batching: BatchOptions = field(default_factory=BatchOptions)
    step_runner: TargetRunner | None = None  # runs the model steps; None: a TargetRunner on ``loaded``
    cuda_graphs: str = "auto"  # that TargetRunner's --cuda-graphs (see starsd.cuda_graphs)

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target-model")
        b = self.batching
        kv_tokens = b.kv_cache_tokens or kv_budget_tokens(self.loaded, b.max_num_seqs, DEFAULT_GPU_MEMORY_FRACTION)
        self.runner = self.step_runner or TargetRunner(self.loaded, kv_tokens, self.cuda_graphs)
        self.budget = KvBudget(b.max_num_seqs, kv_tokens)
        step_tokens = b.max_prefill_tokens + b.max_num_seqs * (self.gamma + 1)
        self.scheduler: StepScheduler[StepRow, RowOutcome] = StepScheduler(
            self.runner.step, self.executor, b.max_num_seqs, step_tokens, self._stepped
        )
        self.step_seconds = 0.0  # the last step's time: the verify time reported to the draft
        if self.draft is not None:
            self.draft.demand = self.demand
            self.draft.on_switch = self.metrics.draft_switched

    def demand(self) -> Demand:
        """Running and waiting completions and the batch's occupancy, as reported to the draft."""
        b = self.budget
        return Demand(b.running, b.waiting, b.running / b.max_num_seqs if b.max_num_seqs else 0.0)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def reservation(self, prompt_tokens: int, max_tokens: int) -> int:
        """Key/value tokens a completion reserves while it runs (its longest possible cache, drafts included)."""
        return prompt_tokens + max_tokens + self.gamma

    def _stepped(self, rows: int, seconds: float) -> None:
        self.step_seconds = seconds
        self.metrics.step_rows.observe(rows)
        self.metrics.verify_seconds.observe(seconds)
        self.metrics.running.set(self.budget.running)
        self.metrics.waiting.set(self.budget.waiting)

    @staticmethod
    def _row(
        session: TargetSession,
        proposal: DraftProposal | None,
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> StepRow:
        """A verification row: the proposal's first ``gamma`` drafts, or none (the round decodes alone)."""
        if proposal is None:
            return StepRow(session, [], params, generator)
        drafts = proposal.token_ids[:gamma]
        n = len(drafts)
        return StepRow(session, drafts, params, generator, q_ids=proposal.q_ids[:n], q_probs=proposal.q_probs[:n])

    async def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        params: SamplingParams,
        stats: GenerationStats,
        stop: StopCheck | None = None,
        ignore_eos: bool = False,
        controls: RequestControls | None = None,
    ) -> AsyncGenerator[list[int], None]:
        """Yield the tokens committed by each round (EOS excluded) until ``max_tokens``, EOS or a stop sequence
        (with ``ignore_eos``, EOS is a token like any other; ``controls`` adds vLLM's extras and logprobs).

        Raises :class:`starsd.verifier.scheduler.BudgetExceeded` before anything runs if the completion can never
        fit this target's key/value budget.
        """
        reserved = self.reservation(len(prompt), max_tokens)
        await self.budget.acquire(reserved)
        self.metrics.running.set(self.budget.running)
        link = None
        session = None
        try:
            session = self.runner.new_session(prompt)
            seed = request_seed(params.seed)
            generator = None if params.greedy else target_generator(seed, self.loaded.device)
            link = DraftLink(self.draft, params, seed) if self.draft else None
            if controls is None:
                controls = RequestControls(ignore_eos=ignore_eos)
            ends = controls.end_ids(self.loaded.eos_token_id)
            rules = controls.rules(self.loaded.eos_token_id)
            penalty = PenaltyCounts(prompt, self.loaded.vocab_size, self.loaded.device) if rules.penalised else None
            chunk = self.batching.max_prefill_tokens
            cohort = -1  # no step yet: nobody waits for this session's first row
            while session.uncached > chunk:  # a long prompt: all but its last chunk, a chunk per step
                await self.scheduler.run(StepRow(session, prefill=chunk), cost=chunk)
            while stats.generated_tokens < max_tokens:
                remaining = max_tokens - stats.generated_tokens
                gamma = self.gamma
                if self.adaptive_gamma and link is not None:
                    gamma = link.next_gamma(self.gamma, self.step_seconds)
                gamma = min(gamma, remaining - 1)  # a round commits up to gamma + 1 tokens
                proposal = None
                if link is not None and gamma > 0:
                    sent = time.perf_counter()
                    with self.scheduler.expect(cohort):  # this session's step-mates wait a little for its row
                        proposal = await link.propose(session.committed, gamma, self.step_seconds)
                    if proposal is not None:
                        self.metrics.draft_rtt_seconds.observe(time.perf_counter() - sent)
                    elif link.malformed:
                        self.metrics.malformed_proposals.inc()
                        link.malformed = False
                row = self._row(session, proposal, gamma, params, generator)
                row.process = round_processor(rules, prompt, stats.token_ids, row.drafts, penalty)
                row.logprobs = controls.logprobs
                outcome = await self.scheduler.run(row, cost=session.uncached + len(row.drafts), cohort=cohort)
                cohort = self.scheduler.finished_steps  # the step this row just ran in
                drafted = len(row.drafts)
                if proposal is not None and link is not None:
                    link.acceptance.update(outcome.accepted, drafted)
                tokens = outcome.tokens
                keep = len(tokens)  # tokens of this round that count (through an EOS or a stop sequence)
                end = first_end(tokens, ends)
                if end is not None:
                    keep = end + 1
                    tokens = tokens[:end]
                    stats.finish_reason = "stop"
                cut = stop(stats.token_ids, tokens) if stop is not None and tokens else None
                if cut is not None:
                    keep = cut
                    tokens = tokens[:cut]
                    stats.finish_reason = "stop"
                drafted, accepted = kept_counts(outcome, drafted, keep)
                stats.rounds += 1
                stats.drafted_tokens += drafted
                stats.accepted_tokens += accepted
                if proposal is None and link is not None and gamma > 0:  # wanted a draft, had none
                    stats.fallback_tokens += len(tokens)
                    self.metrics.fallback_tokens.inc(len(tokens))
                self.metrics.rounds.inc()
                self.metrics.draft_tokens.inc(drafted)
                self.metrics.accepted_tokens.inc(accepted)
                self.metrics.round(drafted, accepted)
                stats.generated_tokens += len(tokens)
                stats.token_ids.extend(tokens)
                if penalty is not None:
                    penalty.add(tokens)  # the device counts follow token_ids exactly
                if outcome.logprobs is not None:
                    stats.logprobs.extend(outcome.logprobs[: len(tokens)])
                if tokens and stats.first_token_at is None:
                    stats.first_token_at = time.perf_counter()
                self.metrics.generated_tokens.inc(len(tokens))
                if tokens:
                    yield tokens
                if stats.finish_reason == "stop":
                    return
        finally:
            if link is not None:
                link.release()
            if session is not None:
                self.runner.release(session)
            self.budget.release(reserved)
            self.metrics.running.set(self.budget.running)
