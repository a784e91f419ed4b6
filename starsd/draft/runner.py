"""The draft's model runner: every session's keys and values in one slot pool, proposals drawn for many
sessions at once.

A session's slot holds the keys and values of a prefix of its tokens, and the next forward pass feeds exactly
the tokens after that prefix, so rollback is setting a length. A request brings the tokens the target committed
since the last request: the runner keeps the longest prefix of its slot that agrees with the committed text (its
accepted proposals; only the proposals are compared, the rest agreed already), drops the rest (the rejected
ones), feeds the new tokens, then proposes ``gamma`` tokens one by one for every session of the batch with one
forward pass per token (:meth:`DraftRunner.propose_batch`). The sessions' caches stay where they are (a
:class:`starsd.kvcache.SlotPool`, as the target's), the chosen tokens stay on the device between passes, and
the whole proposal comes to the host in one copy at the end. (The target's counterpart is
:class:`starsd.verifier.runner.TargetRunner`.)

Drafting ahead (greedy sessions): a greedy draft's proposals are its own greedy continuation of the committed
text, so the runner keeps that continuation (a session's ``chain``) and, while the target verifies, extends it
past the proposal: first the token the draft expects the target to add after accepting every proposal, then a
whole next proposal (:meth:`DraftRunner.draft_ahead`, run when no request waits and stopped as soon as one does).
When the target's next request brings exactly the tokens the chain predicted (every proposal accepted and the
target's own next token the one expected), the next proposal is already there, and only what is still missing is
drafted. Anything else drops the chain: the slot keeps what agrees, as without drafting ahead. Which tokens are
proposed never changes what the target outputs (the target verifies them); drafting ahead changes when they are
computed, not what a greedy draft proposes.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from starsd.checkpoints import LoadedModel
from starsd.cuda_graphs import reserve_bucket
from starsd.proposals import DraftRequest, Proposal
from starsd.sampling import SamplingParams, draft_generator, draw_proposals
from starsd.seeding import request_seed

log = logging.getLogger(__name__)


AHEAD_MODES = ("auto", "on", "off")


def ahead_enabled(mode: str, device: torch.device) -> bool:
    """Whether ``--draft-ahead mode`` drafts ahead on ``device``: ``auto`` does where the draft has an accelerator
    of its own. On a CPU the cores are shared: on two of them, measured beside vLLM (docs/vllm.md), drafting
    ahead took the CPU time the target's verify pass needed and cost more than its hits saved."""
    if mode not in AHEAD_MODES:
        raise ValueError(f"--draft-ahead must be one of {', '.join(AHEAD_MODES)}, got {mode!r}")
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def agreed_prefix(cached: list[int], before: int, new_tokens: list[int]) -> int:
    """How many of a session's ``cached`` tokens agree with its committed text, which was ``before`` tokens long
    (all of them agreeing with ``cached[:before]``) and has just grown by ``new_tokens``: only the tokens cached
    past ``before`` (the last proposals) are compared."""
    if len(cached) <= before:
        return len(cached)
    agreed = before
    for mine, theirs in zip(cached[before:], new_tokens, strict=False):
        if mine != theirs:
            break
        agreed += 1
    return agreed


@dataclass
class DraftSessionState:
    """The draft's private state for one target session."""

    committed: list[int] = field(default_factory=list)  # every token the target has committed so far
    cached: list[int] = field(default_factory=list)  # tokens whose keys/values are in the slot (a prefix of context)
    slot: Any = None  # starsd.kvcache.PoolSlot, from the session's first forward pass
    generator: torch.Generator | None = None
    # The draft's greedy continuation of ``committed`` (empty unless the last request was greedy): the last
    # proposal, and past it whatever was drafted ahead.
    chain: list[int] = field(default_factory=list)
    ahead_to: int = 0  # how long ``chain`` should grow while the target verifies (0: no drafting ahead)

    @property
    def context(self) -> list[int]:
        return self.committed + self.chain


@dataclass
class _Row:
    """One session's share of a drafting batch."""

    index: int  # in the request list
    feed: list[int]
    gamma: int  # tokens to draft in this batch
    ready: list[int] = field(default_factory=list)  # proposed tokens already drafted ahead


@dataclass
class _Drawn:
    """A batch's draws on the host: ``tokens[t][b]`` at step ``t`` for row ``b``; for sampled rows, each step's
    support ids and probabilities as well."""

    tokens: list[list[int]]
    ids: list[list[list[int]]] | None
    q: list[list[list[float]]] | None


class DraftRunner:
    """Proposes tokens for many sessions from one small model."""

    def __init__(self, loaded: LoadedModel, cuda_graphs: str = "auto", ahead: str = "auto", lean: bool = True) -> None:
        """``cuda_graphs``: ``auto`` (on with CUDA), ``on`` or ``off``: replay the decoding steps from captured
        CUDA graphs (see :mod:`starsd.cuda_graphs`). ``ahead``: ``auto`` (on with CUDA), ``on`` or ``off``: draft
        ahead for greedy sessions while idle (:func:`ahead_enabled`). ``lean``: decode Llama-shaped models with
        :class:`starsd.lean_decode.LeanDecoder` rather than the model's own forward pass."""
        from starsd.cuda_graphs import graphs_enabled

        self.loaded = loaded
        self.ahead = ahead_enabled(ahead, loaded.device)
        self._last: list[DraftSessionState] = []  # the greedy sessions of the latest batch: drafted ahead next
        self._lock = threading.Lock()  # one forward pass at a time on this model
        self._pool: Any = None  # starsd.kvcache.SlotPool, made with the first forward pass
        self._use_graphs = graphs_enabled(cuda_graphs, loaded.device)
        self._graphs: Any = None  # starsd.cuda_graphs.DecodeGraphs, made with the pool when graphs are used
        self.lean_decoder: Any = None  # starsd.lean_decode.LeanDecoder, when asked for and the model allows one
        if lean:
            from starsd.lean_decode import LeanDecoder, unsupported_reason

            reason = unsupported_reason(loaded.model)
            if reason is None:
                self.lean_decoder = LeanDecoder(loaded.model, loaded.max_context + 64)
            else:
                log.info("the draft runs the model's own forward pass (no lean pass for %s)", reason)

    def describe(self) -> str:
        """How this runner drafts, for the draft's start-up line."""
        passes = "lean passes" if self.lean_decoder is not None else "the model's own passes"
        graphs = ", CUDA graphs" if self._use_graphs else ""
        return f"{passes}{graphs}, drafting ahead {'on' if self.ahead else 'off'}"

    @property
    def vocab_size(self) -> int:
        return self.loaded.vocab_size

    @property
    def graph_captures(self) -> int:
        """CUDA-graph buckets captured so far (0 when the decoding steps run eagerly)."""
        return self._graphs.captures if self._graphs is not None else 0

    def new_state(self, seed: int | None) -> DraftSessionState:
        """A session's state; ``seed`` is the request's seed (the draft's own stream is derived from it)."""
        generator = draft_generator(request_seed(seed), self.loaded.device)
        return DraftSessionState(generator=generator)

    def _slot_pool(self) -> Any:
        if self._pool is None:
            from starsd import kvcache  # imports transformers: only once a model is in use
            from starsd.verifier.memory import kv_geometry

            model = self.loaded.model
            layers, heads, head_dim = kv_geometry(model.config)
            self._pool = kvcache.SlotPool(layers, heads, head_dim, self.loaded.placement.dtype, self.loaded.device)
            kvcache.use_pool_attention(model)
            if self._use_graphs:
                from starsd.cuda_graphs import DecodeGraphs

                self._graphs = DecodeGraphs(model, self._pool)
        return self._pool

    @functools.cached_property
    def _logits_to_keep(self) -> bool:
        return "logits_to_keep" in inspect.signature(self.loaded.model.forward).parameters

    def _sync(self, state: DraftSessionState, new_tokens: list[int], gamma: int, greedy: bool) -> _Row | None:
        """Append the newly committed tokens, drop what they contradict; return what this request still needs
        drafted (None: nothing to propose)."""
        before = len(state.committed)
        state.committed.extend(new_tokens)
        committed = state.committed
        chain = state.chain
        if greedy and len(chain) > len(new_tokens) and chain[: len(new_tokens)] == new_tokens:
            # Predicted: the slot agrees with the whole context, the rest of the chain is the draft's proposal.
            del chain[: len(new_tokens)]
        else:
            chain.clear()
            # Keep the cached prefix that agrees with the committed text; at least one token must be fed.
            keep = max(0, min(agreed_prefix(state.cached, before, new_tokens), len(committed) - 1))
            del state.cached[keep:]
        gamma = max(0, min(gamma, self.loaded.max_context - len(committed)))
        state.ahead_to = 0
        if gamma == 0 or not committed:
            chain.clear()
            return None
        ready = chain[:gamma]
        feed = [] if len(ready) == gamma else state.context[len(state.cached) :]
        return _Row(-1, feed, gamma - len(ready), ready)

    def propose(
        self,
        state: DraftSessionState,
        new_tokens: list[int],
        gamma: int,
        params: SamplingParams,
        top_k: int,
    ) -> Proposal:
        """Append ``new_tokens`` to the session's committed text and propose up to ``gamma`` tokens."""
        return self.propose_batch([DraftRequest(state, new_tokens, gamma, params, top_k)])[0]

    def propose_batch(self, requests: list[DraftRequest]) -> list[Proposal]:
        """Propose for several sessions with one forward pass per drafted token (the sessions' caches stay in
        their slots): the first pass feeds each session's new tokens right-aligned (a mask hides the padding,
        explicit positions keep every row at its own), the next ones feed each row its last proposal."""
        proposals = [Proposal(token_ids=[]) for _ in requests]
        with self._lock, torch.inference_mode():
            rows: list[_Row] = []
            for i, r in enumerate(requests):
                row = self._sync(r.state, r.new_tokens, r.gamma, r.params.greedy)
                if row is None:
                    continue
                row.index = i
                proposals[i].ahead = len(row.ready)
                if row.gamma:
                    rows.append(row)
                else:
                    proposals[i].token_ids = list(row.ready)
            if rows:
                self._propose_rows(requests, rows, proposals)
            self._last = []
            for r in requests:
                state = r.state
                if self.ahead and r.params.greedy and state.chain and state.slot is not None:
                    # The token expected after the proposal, then a whole next proposal.
                    room = self.loaded.max_context - len(state.committed)
                    state.ahead_to = min(len(state.chain) + 1 + r.gamma, room)
                    self._last.append(state)
        return proposals

    def _propose_rows(self, requests: list[DraftRequest], rows: list[_Row], proposals: list[Proposal]) -> None:
        states = [requests[row.index].state for row in rows]
        params = [requests[row.index].params for row in rows]
        top_ks = [requests[row.index].top_k for row in rows]
        drawn = self._draft(states, [row.feed for row in rows], [row.gamma for row in rows], params, top_ks)
        for b, (row, state) in enumerate(zip(rows, states, strict=True)):
            out = proposals[row.index]
            new = [drawn.tokens[t][b] for t in range(row.gamma)]
            out.token_ids = row.ready + new
            if drawn.ids is not None and drawn.q is not None and not params[b].greedy:
                out.q_ids = [drawn.ids[t][b][: min(top_ks[b], self.vocab_size)] for t in range(row.gamma)]
                out.q_probs = [drawn.q[t][b][: min(top_ks[b], self.vocab_size)] for t in range(row.gamma)]
            state.cached.extend(row.feed)
            state.cached.extend(new[:-1])  # the last proposal is never fed
            state.chain = list(out.token_ids) if params[b].greedy else []  # a copy: drafting ahead extends it

    def _logits(
        self, input_ids: torch.Tensor, inputs: Any, cache: Any, start: int, kwargs: dict[str, Any] | None = None
    ) -> torch.Tensor:
        """One forward pass over ``input_ids [B, W]`` -> the last position's logits ``[B, V]``: the lean pass when
        there is one, else the model's own. ``start``: where a lone row's fed tokens begin (``inputs`` carries no
        positions for one row)."""
        from starsd import kvcache

        if self.lean_decoder is None:
            own = {**kvcache.with_cache(cache), **inputs.model_kwargs(), **(kwargs or {})}
            logits: torch.Tensor = self.loaded.model(input_ids=input_ids, use_cache=True, **own).logits[:, -1]
            return logits
        positions = start if inputs.positions is None else inputs.positions  # one row: after its cached tokens
        logits = self.lean_decoder.logits(input_ids, positions, cache, inputs.mask)
        return logits

    def draft_ahead(self, stop: Callable[[], bool]) -> int:
        """Extend the chains of the latest batch's greedy sessions, one forward pass at a time, until they are
        long enough or ``stop()`` says a request waits; returns how many passes ran."""
        if not self.ahead:
            return 0
        with self._lock, torch.inference_mode():
            states = [s for s in self._last if len(s.chain) < s.ahead_to and s.slot is not None]
            self._last = []
            if not states or stop():
                return 0
            want = [s.ahead_to - len(s.chain) for s in states]
            feeds = [s.context[len(s.cached) :] for s in states]
            greedy = [SamplingParams(temperature=0.0)] * len(states)
            drawn = self._draft(states, feeds, want, greedy, [1] * len(states), stop=stop)
            steps = len(drawn.tokens)
            for b, (state, feed) in enumerate(zip(states, feeds, strict=True)):
                new = [drawn.tokens[t][b] for t in range(min(steps, want[b]))]  # a row past its own want: unused
                state.cached.extend(feed)
                state.cached.extend(new[:-1])
                state.chain.extend(new)
            return steps

    def _draft(
        self,
        states: list[DraftSessionState],
        feeds: list[list[int]],
        gammas: list[int],
        params: list[SamplingParams],
        top_ks: list[int],
        stop: Callable[[], bool] | None = None,
    ) -> _Drawn:
        """Draft ``max(gammas)`` tokens for every row, one forward pass per token (a row past its own gamma
        feeds on: its extra keys are never attended); ``stop`` ends it early, between passes."""
        from starsd import kvcache

        pool = self._slot_pool()
        for s in states:
            if s.slot is None:
                s.slot = pool.take()
        steps = max(gammas)
        cached = [len(s.cached) for s in states]
        widths = [len(feed) for feed in feeds]
        need = 1 + max(c + w for c, w in zip(cached, widths, strict=True)) + steps
        pool.reserve(need)
        graphs = self._graphs
        if graphs is not None:
            reserve_bucket(pool, need)  # else a pool that just holds the sessions is shorter than their bucket
        slots = [s.slot for s in states]
        at = pool.rows_of(slots)
        device = self.loaded.device
        generators = [s.generator for s in states]
        batch = len(states)
        inputs = kvcache.step_inputs(feeds, at, cached, widths, device, graphs is not None)
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep else {}  # the last position only
        cache = pool.step_cache(slots, cached, widths, inputs)
        assert inputs.input_ids is not None
        logits = self._logits(inputs.input_ids, inputs, cache, cached[0], kwargs)  # [B, V]
        drawn = [draw_proposals(logits, params, top_ks, generators)]  # per step: (tokens [B], ids, q)
        lengths = [c + w for c, w in zip(cached, widths, strict=True)]
        ones = [1] * batch
        for step in range(1, steps):
            if stop is not None and stop():
                break
            inputs = inputs.next_token()
            replayed = None
            if graphs is not None and inputs.positions is not None and inputs.mask is not None:
                replayed = graphs.logits(drawn[-1][0], inputs.rows, inputs.positions, inputs.mask)  # None: eager
            if replayed is not None:
                logits = replayed
            else:
                cache = pool.step_cache(slots, lengths, ones, inputs)
                logits = self._logits(drawn[-1][0].unsqueeze(1), inputs, cache, lengths[0])
            live = [step < gamma for gamma in gammas]
            drawn.append(draw_proposals(logits, params, top_ks, generators, live))
            lengths = [n + 1 for n in lengths]
        tokens, ids, q = _to_host(drawn)  # the draws' one device-to-host copy
        return _Drawn(tokens, ids, q)


def _to_host(
    drawn: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]],
) -> tuple[list[list[int]], list[list[list[int]]] | None, list[list[list[float]]] | None]:
    """Every step's draws ``tokens [B]``, ``ids [B, K]``, ``q [B, K]`` in one device-to-host copy: token and
    support ids are exact in float64 (below 2**53), and float32 probabilities are too."""
    steps, batch = len(drawn), drawn[0][0].shape[0]
    tokens = torch.stack([d[0] for d in drawn]).double()  # [S, B]
    sampled = drawn[0][1] is not None
    if not sampled:
        return [[int(t) for t in row] for row in tokens.tolist()], None, None
    ids = torch.stack([d[1] for d in drawn if d[1] is not None]).double()  # [S, B, K]
    q = torch.stack([d[2] for d in drawn if d[2] is not None]).double()
    k = ids.shape[-1]
    flat = torch.cat([tokens.reshape(-1), ids.reshape(-1), q.reshape(-1)]).tolist()
    n = steps * batch
    host_tokens = [[int(flat[t * batch + b]) for b in range(batch)] for t in range(steps)]
    id_values, q_values = flat[n : n + n * k], flat[n + n * k :]
    host_ids = [
        [[int(v) for v in id_values[(t * batch + b) * k : (t * batch + b + 1) * k]] for b in range(batch)]
        for t in range(steps)
    ]
    host_q = [[q_values[(t * batch + b) * k : (t * batch + b + 1) * k] for b in range(batch)] for t in range(steps)]
    return host_tokens, host_ids, host_q
