"""The target's generation loop: ask the draft, verify in a batched step, commit ``l + 1`` tokens.

Many completions run concurrently on one event loop. Each one's rounds go to the :class:`StepScheduler`, which
verifies every ready session in one forward pass on the model thread (continuous batching), while the others
wait for their drafts: one completion's verification overlaps other completions' round trips (pipelining).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from starsd import defaults
from starsd.checkpoints import LoadedModel
from starsd.proposals import Proposal
from starsd.sampling import SamplingParams, target_generator
from starsd.seeding import request_seed
from starsd.verifier.draft_client import Demand, DraftClient
from starsd.verifier.draft_link import DraftLink
from starsd.verifier.memory import DEFAULT_GPU_MEMORY_FRACTION, kv_budget_tokens
from starsd.verifier.metrics import TargetMetrics
from starsd.verifier.processing import LogitRules, PenaltyCounts, round_processor
from starsd.verifier.runner import RowOutcome, StepRow, TargetRunner, TargetSession, TokenLogprobs
from starsd.verifier.scheduler import KvBudget, StepScheduler
from starsd.verifier.step_runner import StepRunner


@dataclass(frozen=True)
class BatchOptions:
    """How much one target runs at once (see starsd.verifier.scheduler)."""

    max_num_seqs: int = defaults.MAX_NUM_SEQS  # sessions in one step, and completions running at once
    kv_cache_tokens: int | None = None  # key/value tokens reserved at most; None: see kv_budget_tokens
    max_prefill_tokens: int = defaults.MAX_PREFILL_TOKENS  # prompt tokens fed per session and step (then chunks)


@dataclass(frozen=True)
class RoundEnd:
    """What of a round's tokens the completion keeps (see :func:`round_outcome`)."""

    tokens: list[int]  # the tokens the completion keeps (an end token excluded)
    keep: int  # the round's tokens that count: through the end token or the stop sequence, else all
    stopped: bool  # an end token or a stop sequence ended the completion


@dataclass(frozen=True)
class RoundStats:
    """One round's counts, as the completion's ``starsd`` object and the metrics take them."""

    drafted: int  # drafts verified and counted (drafts past an end are not, see kept_counts)
    accepted: int
    fallback: int  # tokens decoded without a draft where one was wanted
    generated: int  # tokens the completion keeps


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

    def add(self, counts: RoundStats, end: RoundEnd, logprobs: list[TokenLogprobs] | None, now: float) -> None:
        """Take one round (committed at ``now``, a perf_counter() time)."""
        self.rounds += 1
        self.drafted_tokens += counts.drafted
        self.accepted_tokens += counts.accepted
        self.fallback_tokens += counts.fallback
        self.generated_tokens += counts.generated
        self.token_ids.extend(end.tokens)
        if logprobs is not None:
            self.logprobs.extend(logprobs[: len(end.tokens)])
        if end.tokens and self.first_token_at is None:
            self.first_token_at = now
        if end.stopped:
            self.finish_reason = "stop"


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


def round_outcome(tokens: list[int], ends: tuple[int, ...], stop: Callable[[list[int]], int | None] | None) -> RoundEnd:
    """What a completion keeps of a round's ``tokens``: up to the first end token (excluded), then up to where a
    stop sequence ends (``stop(tokens)``: how many tokens to keep, None if no stop sequence ends within them)."""
    keep, stopped = len(tokens), False
    end = first_end(tokens, ends)
    if end is not None:
        keep, tokens, stopped = end + 1, tokens[:end], True
    cut = stop(tokens) if stop is not None and tokens else None
    if cut is not None:
        keep, tokens, stopped = cut, tokens[:cut], True
    return RoundEnd(tokens, keep, stopped)


def round_stats(outcome: RowOutcome, drafted: int, end: RoundEnd, fell_back: bool) -> RoundStats:
    """The counts of a round that verified ``drafted`` drafts (``fell_back``: it wanted a draft and had none)."""
    drafted, accepted = kept_counts(outcome, drafted, end.keep)
    return RoundStats(drafted, accepted, len(end.tokens) if fell_back else 0, len(end.tokens))


@dataclass
class _Completion:
    """What stays fixed through one completion's rounds."""

    prompt: list[int]
    session: TargetSession
    params: SamplingParams
    generator: torch.Generator | None
    link: DraftLink | None
    controls: RequestControls
    rules: LogitRules
    ends: tuple[int, ...]
    penalty: PenaltyCounts | None


@dataclass
class TargetEngine:
    loaded: LoadedModel
    draft: DraftClient | None
    gamma: int = defaults.GAMMA  # tokens drafted per round; with adaptive_gamma, the most a round asks for
    adaptive_gamma: bool = False
    metrics: TargetMetrics = field(default_factory=TargetMetrics)
    batching: BatchOptions = field(default_factory=BatchOptions)
    step_runner: StepRunner | None = None  # runs the model steps; None: a TargetRunner on ``loaded``
    cuda_graphs: str = "auto"  # that TargetRunner's --cuda-graphs (see starsd.cuda_graphs)

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target-model")
        b = self.batching
        kv_tokens = b.kv_cache_tokens or kv_budget_tokens(self.loaded, b.max_num_seqs, DEFAULT_GPU_MEMORY_FRACTION)
        self.runner: StepRunner = self.step_runner or TargetRunner(self.loaded, kv_tokens, self.cuda_graphs)
        self.budget = KvBudget(b.max_num_seqs, kv_tokens)
        step_tokens = b.max_prefill_tokens + b.max_num_seqs * (self.gamma + 1)
        self.scheduler: StepScheduler[StepRow, RowOutcome] = StepScheduler(
            self.runner.step, self.executor, b.max_num_seqs, step_tokens, self._stepped
        )
        self.step_seconds = 0.0  # the last step's time: the verify time reported to the draft
        if self.draft is not None:
            self.draft.demand = self.demand
            self.draft.on_switch = self.metrics.draft_switched
            self.draft.on_malformed = self.metrics.malformed_proposals.inc

    def demand(self) -> Demand:
        """Running and waiting completions and the batch's occupancy, as reported to the draft."""
        b = self.budget
        return Demand(b.running, b.waiting, b.running / b.max_num_seqs if b.max_num_seqs else 0.0)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _release_session(self, session: TargetSession) -> None:
        """Give a finished session's slot back on the model thread, after the step in flight: a completion
        cancelled while its row is in a step (its client left) must not free a slot that step is still using
        (the step would fail, and every completion in it with a 500)."""
        try:
            self.executor.submit(self.runner.release, session)
        except RuntimeError:  # the engine is closed: no step runs any more
            self.runner.release(session)

    def reservation(self, prompt_tokens: int, max_tokens: int) -> int:
        """Key/value tokens a completion reserves while it runs (its longest possible cache, drafts included)."""
        return prompt_tokens + max_tokens + self.gamma

    def _stepped(self, rows: int, seconds: float) -> None:
        self.step_seconds = seconds
        self.metrics.step_rows.observe(rows)
        self.metrics.verify_seconds.observe(seconds)
        self.metrics.running.set(self.budget.running)
        self.metrics.waiting.set(self.budget.waiting)

    def _start(self, prompt: list[int], params: SamplingParams, controls: RequestControls) -> _Completion:
        """A completion's session on the model and on the draft, its random stream and its logit rules."""
        session = self.runner.new_session(prompt)
        seed = request_seed(params.seed)
        generator = None if params.greedy else target_generator(seed, self.runner.device)
        link = DraftLink(self.draft, params, seed) if self.draft else None
        eos = self.loaded.eos_token_id
        rules = controls.rules(eos)
        penalty = PenaltyCounts(prompt, self.runner.vocab_size, self.runner.device) if rules.penalised else None
        return _Completion(prompt, session, params, generator, link, controls, rules, controls.end_ids(eos), penalty)

    def _gamma(self, link: DraftLink | None, remaining: int) -> int:
        """Drafts to ask for this round (a round commits up to gamma + 1 tokens)."""
        gamma = self.gamma
        if self.adaptive_gamma and link is not None:
            gamma = link.next_gamma(self.gamma, self.step_seconds)
        return min(gamma, remaining - 1)

    async def _propose(self, c: _Completion, gamma: int, cohort: int) -> Proposal | None:
        """The draft's proposal for this round, or None (no draft, none wanted, or none in time)."""
        if c.link is None or gamma <= 0:
            return None
        sent = time.perf_counter()
        with self.scheduler.expect(cohort):  # this session's step-mates wait a little for its row
            proposal = await c.link.propose(c.session.committed, gamma, self.step_seconds)
        if proposal is not None:
            self.metrics.draft_rtt_seconds.observe(time.perf_counter() - sent)
        return proposal

    @staticmethod
    def _row(c: _Completion, proposal: Proposal | None, gamma: int, generated: list[int]) -> StepRow:
        """A verification row: the proposal's first ``gamma`` drafts, or none (the round decodes alone)."""
        if proposal is None:
            row = StepRow(c.session, [], c.params, c.generator)
        else:
            drafts = proposal.token_ids[:gamma]
            n = len(drafts)
            q_ids, q_probs = proposal.q_ids[:n], proposal.q_probs[:n]
            row = StepRow(c.session, drafts, c.params, c.generator, q_ids=q_ids, q_probs=q_probs)
        row.process = round_processor(c.rules, c.prompt, generated, row.drafts, c.penalty)
        row.logprobs = c.controls.logprobs
        return row

    def _count(self, counts: RoundStats) -> None:
        m = self.metrics
        m.rounds.inc()
        m.draft_tokens.inc(counts.drafted)
        m.accepted_tokens.inc(counts.accepted)
        m.round(counts.drafted, counts.accepted)
        m.fallback_tokens.inc(counts.fallback)
        m.generated_tokens.inc(counts.generated)

    async def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        params: SamplingParams,
        stats: GenerationStats,
        stop: StopCheck | None = None,
        controls: RequestControls | None = None,
    ) -> AsyncGenerator[list[int], None]:
        """Yield the tokens committed by each round (EOS excluded) until ``max_tokens``, EOS or a stop sequence
        (``controls``: vLLM's extras, ignore_eos among them, and logprobs; none by default).

        Raises :class:`starsd.verifier.scheduler.BudgetExceeded` before anything runs if the completion can never
        fit this target's key/value budget.
        """
        reserved = self.reservation(len(prompt), max_tokens)
        await self.budget.acquire(reserved)
        self.metrics.running.set(self.budget.running)
        c = None
        try:
            c = self._start(prompt, params, controls or RequestControls())
            chunk = self.batching.max_prefill_tokens
            while c.session.uncached > chunk:  # a long prompt: all but its last chunk, a chunk per step
                await self.scheduler.run(StepRow(c.session, prefill=chunk), cost=chunk)
            cohort = -1  # no step yet: nobody waits for this session's first row
            while stats.generated_tokens < max_tokens:
                gamma = self._gamma(c.link, max_tokens - stats.generated_tokens)
                proposal = await self._propose(c, gamma, cohort)
                row = self._row(c, proposal, gamma, stats.token_ids)
                outcome = await self.scheduler.run(row, cost=c.session.uncached + len(row.drafts), cohort=cohort)
                cohort = self.scheduler.finished_steps  # the step this row just ran in
                if proposal is not None and c.link is not None:
                    c.link.acceptance.update(outcome.accepted, len(row.drafts))
                bound = None if stop is None else functools.partial(stop, stats.token_ids)
                end = round_outcome(outcome.tokens, c.ends, bound)
                fell_back = proposal is None and c.link is not None and gamma > 0  # wanted a draft, had none
                counts = round_stats(outcome, len(row.drafts), end, fell_back)
                self._count(counts)
                stats.add(counts, end, outcome.logprobs, time.perf_counter())
                if c.penalty is not None:
                    c.penalty.add(end.tokens)  # the device counts follow token_ids exactly
                if end.tokens:
                    yield end.tokens
                if end.stopped:
                    return
        finally:
            if c is not None:
                if c.link is not None:
                    c.link.release()
                self._release_session(c.session)
            self.budget.release(reserved)
            self.metrics.running.set(self.budget.running)
