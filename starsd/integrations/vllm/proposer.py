"""StarSD's draft as vLLM's proposer: ``--speculative-config '{"method": "custom_class",
"model": "starsd.integrations.vllm.StarSDProposer", "num_speculative_tokens": K}'``.

vLLM constructs the class with its ``VllmConfig`` and calls :meth:`StarSDProposer.propose` after every step
with the rows of its batch. Each step's rows go to the StarSD draft as one burst of requests on this replica's
stream (the draft drafts them as one batch), and the draft's greedy proposals come back as the rows' draft
tokens. vLLM's rejection sampler verifies proposals that carry no draft probabilities exactly, so the outputs
are those of vLLM alone. When the draft is away or late, rows get no proposals for that step and vLLM decodes
normally; the link reconnects in the background.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from starsd.integrations.vllm.config import ConfigError, gamma_limit_error, load_config
from starsd.integrations.vllm.link import StepLink
from starsd.integrations.vllm.rows import (
    Session,
    StepPlan,
    Tokens,
    apply_answers,
    as_tokens,
    plan_step,
    row_gamma,
    timed_since_last_step,
)
from starsd.proposal_codec import proposal_fault
from starsd.proto import starsd_pb2 as pb

log = logging.getLogger("starsd.vllm")


def _visible_logs() -> None:
    """vLLM configures only its own loggers: give StarSD's a handler of its own, so that the start-up line
    (the bound a step may wait) and the warnings reach vLLM's log."""
    root = logging.getLogger("starsd")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def model_fingerprint(vllm_config: Any) -> str:
    """The vocabulary fingerprint of the tokenizer vLLM serves (as the StarSD draft computes its own)."""
    from transformers import AutoTokenizer

    from starsd.vocab import vocab_fingerprint

    model_config = vllm_config.model_config
    tokenizer = AutoTokenizer.from_pretrained(
        model_config.tokenizer,
        revision=getattr(model_config, "tokenizer_revision", None),
        trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
    )
    return vocab_fingerprint(tokenizer)


class Throttle:
    """At most one log line per ``interval`` seconds for a recurring problem (a step runs every few
    milliseconds: a draft refusing every request must not flood vLLM's log); says how many were left out."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.next_at = 0.0
        self.held = 0

    def __call__(self, level: int, message: str, *args: object, exc_info: bool = False) -> bool:
        """Log unless a line went out less than ``interval`` ago; whether this one did."""
        now = time.monotonic()
        if now < self.next_at:
            self.held += 1
            return False
        if self.held:
            message += f" ({self.held} more like it in the last {self.interval:g} s)"
        log.log(level, message, *args, exc_info=exc_info)
        self.next_at, self.held = now + self.interval, 0
        return True


class StarSDProposer:
    """vLLM's proposer interface (``propose``, ``load_model``) over a StarSD draft."""

    def __init__(self, vllm_config: Any) -> None:
        _visible_logs()
        spec = vllm_config.speculative_config
        self.config = load_config(os.environ, int(spec.num_speculative_tokens))
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.max_num_seqs = max(1, int(vllm_config.scheduler_config.max_num_seqs))
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.link = StepLink(self.config, model_fingerprint(vllm_config), self.vocab_size)
        try:
            info = self.link.check()
        except BaseException:
            self.link.close()
            raise
        self.draft_max_context = self.max_model_len
        if info is not None:
            if (problem := gamma_limit_error(self.config.gamma, int(info.max_gamma))) is not None:
                self.link.close()
                raise ConfigError(problem)
            self.draft_max_context = int(info.max_context) or self.max_model_len
            log.info("StarSD draft %r shares this model's vocabulary", info.model_name)
        else:
            log.warning("no StarSD draft answered at start: decoding alone until one does (it is checked then)")
        self.link.start()
        log.info(
            "StarSD proposer: target id %r, drafts %s, gamma %d; a step waits at most %.3f s for the draft, "
            "then decodes alone for %d steps",
            self.config.target_id,
            self.config.describe(),
            self.config.gamma,
            self.config.timeout,
            self.config.cooldown_steps,
        )
        self.sessions: dict[int, Session] = {}
        self.previous: dict[int, int] = {}  # row -> session id, as of the previous step
        self.generation = -1  # the link's stream the sessions live on
        self.step = 0
        self.cooldown = 0
        self.last_return = 0.0  # when the previous propose returned: the step between is vLLM's verify pass
        self.last_rtt = 0.0
        # Counters (tests and logs read them; vLLM's own spec-decode metrics count acceptance).
        self.steps_drafted = 0
        self.steps_missed = 0
        self.steps_failed = 0
        self._refusals = Throttle()
        self._failures = Throttle()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM hands its target model over here; the draft runs elsewhere, so nothing to load."""

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: npt.NDArray[np.integer],
        token_ids_cpu: npt.NDArray[np.integer],
        slot_mappings: Any = None,
        **_: Any,
    ) -> list[list[int]]:
        """Draft tokens for each row of the step (an empty list: none for that row)."""
        started = time.perf_counter()
        verify_seconds = started - self.last_return if self.last_return else 0.0
        n = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(n)]
        self.step += 1
        try:
            if self.cooldown > 0:
                self.cooldown -= 1
                return out
            if not self.link.connected:
                return out
            if self.generation != self.link.generation:  # a new stream: the draft holds none of our sessions
                self.sessions, self.previous = {}, {}
                self.generation = self.link.generation
            rows: list[Tokens | None] = []
            gammas: list[int] = []
            for i in range(n):
                length = int(num_tokens_no_spec[i])
                # A row without sampled tokens is mid-prefill (or discarded): vLLM schedules no drafts for it.
                if not sampled_token_ids[i] or length <= 0:
                    rows.append(None)
                    gammas.append(0)
                    continue
                rows.append(as_tokens(token_ids_cpu[i, :length]))
                gammas.append(row_gamma(length, self.config.gamma, self.max_model_len, self.draft_max_context))
            plan = plan_step(
                rows, gammas, self.sessions, self.previous, self.step, self.config.idle_steps, self.link.new_session_id
            )
            self._run(plan, out, verify_seconds, running=sum(r is not None for r in rows))
            return out
        except Exception:  # a fault here must never fail vLLM's step: decode this step alone, start afresh
            self.steps_failed += 1
            self._failures(logging.ERROR, "StarSD proposer step failed; decoding it alone", exc_info=True)
            self.sessions, self.previous = {}, {}
            self.generation = -1
            return [[] for _ in range(n)]
        finally:
            self.last_return = time.perf_counter()

    def _run(self, plan: StepPlan, out: list[list[int]], verify_seconds: float, running: int) -> None:
        """Send the plan's burst and fill ``out`` with the answers that arrived in time."""
        occupancy = min(1.0, running / self.max_num_seqs)
        requests = []
        for ask in plan.asks:
            # Both timings describe the previous step: sent only for a session that was in it.
            timed = timed_since_last_step(ask, self.sessions, self.step)
            requests.append(
                pb.ProposeRequest(
                    target_id=self.config.target_id,
                    session_id=ask.session_id,
                    seq=ask.seq,
                    tokens=ask.new_tokens,
                    gamma=ask.gamma,
                    verify_seconds=verify_seconds if timed else 0.0,
                    rtt_seconds=self.last_rtt if timed else 0.0,
                    running_requests=running,
                    occupancy=occupancy,
                )
            )
        releases = [self._release(s) for s in plan.release]
        sent = time.perf_counter()
        burst = self.link.burst(requests, releases, self.config.timeout)
        self.last_rtt = time.perf_counter() - sent
        answered: set[int] = set()
        for ask, answer in zip(plan.asks, burst.answers, strict=True):
            if answer is None:
                continue
            if answer.error_code:
                self._refusals(logging.WARNING, "the StarSD draft refused a request: %s", answer.error_message)
                continue
            fault = proposal_fault(answer, ask.gamma, self.vocab_size, sampled=False)
            if fault is not None:
                self._refusals(logging.WARNING, "malformed StarSD draft answer: %s", fault)
                continue
            answered.add(ask.row)
            out[ask.row] = list(answer.token_ids)
        self.sessions, failed = apply_answers(self.sessions, plan, answered, self.step)
        self.previous = {row: sid for row, sid in plan.matches.items() if sid in self.sessions}
        if failed:  # the draft's view of these is unknown: free them (no answer awaited)
            self.link.burst([], [self._release(s) for s in failed], self.config.timeout)
        if plan.asks:
            self.steps_drafted += 1
        if burst.late:
            self.steps_missed += 1
            self.cooldown = self.config.cooldown_steps
            log.warning(
                "the StarSD draft did not answer %d of %d rows within %.3f s: decoding alone for %d steps",
                burst.late,
                len(plan.asks),
                self.config.timeout,
                self.config.cooldown_steps,
            )

    def _release(self, session: Session) -> pb.ProposeRequest:
        return pb.ProposeRequest(
            target_id=self.config.target_id, session_id=session.session_id, seq=session.seq + 1, release=True
        )

    def close(self) -> None:
        self.link.close()
