"""The draft's model runner: per-session key/value caches, and proposals drawn one token at a time.

A session's cache holds the keys and values of a prefix of its tokens, and the next forward pass feeds exactly
the tokens after that prefix, so rollback is a crop. A request brings the tokens the target committed since the
last request: the runner keeps the longest prefix of its cache that agrees with the committed text (its
accepted proposals), crops the rest (the rejected ones), feeds the new tokens, then proposes ``gamma`` tokens one
by one, for many sessions at once in :meth:`DraftRunner.propose_batch`. (The target's counterpart is
:class:`starsd.verifier.runner.TargetRunner`.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from starsd.checkpoints import LoadedModel
from starsd.proposals import DraftRequest, Proposal
from starsd.sampling import SamplingParams, draft_generator, draw_proposal
from starsd.seeding import request_seed


def new_cache() -> Any:
    """An empty per-session key/value cache (see starsd.kvcache)."""
    from starsd import kvcache  # imports transformers: only once a model is in use

    return kvcache.new_cache()


def _forward(model: Any, tokens: list[int], cache: Any) -> torch.Tensor:
    """Feed ``tokens`` after the cached prefix; returns logits ``[T, V]``."""
    from starsd import kvcache

    input_ids = torch.tensor([tokens], dtype=torch.long, device=model.device)  # [1, T]
    out = model(input_ids=input_ids, use_cache=True, **kvcache.with_cache(cache))
    logits: torch.Tensor = out.logits[0]  # [T, V]
    return logits


def _attention_4d(keys: torch.Tensor, queries: int) -> torch.Tensor:
    """The full attention mask ``[B, 1, queries, K]`` (True: attend) for the last ``queries`` columns.

    ``keys [B, K]`` marks the real (1) and padding (0) key columns; query ``i`` sits at column
    ``K - queries + i`` and attends the real columns up to its own. Built here because transformers builds a
    padded batch's mask with ``vmap``, which costs far more than the tiny draft's forward pass.
    """
    total = keys.shape[1]
    columns = torch.arange(total, device=keys.device)
    rows = torch.arange(total - queries, total, device=keys.device).unsqueeze(1)  # [queries, 1]
    causal = columns.unsqueeze(0) <= rows  # [queries, K]
    return keys.bool()[:, None, None, :] & causal[None, None, :, :]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class DraftSessionState:
    """The draft's private state for one target session."""

    committed: list[int] = field(default_factory=list)  # every token the target has committed so far
    cached: list[int] = field(default_factory=list)  # tokens whose keys/values are in ``cache``
    cache: Any = None
    generator: torch.Generator | None = None


class DraftRunner:
    """Proposes tokens for many sessions from one small model (one session at a time)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self._lock = threading.Lock()  # one forward pass at a time on this model

    @property
    def vocab_size(self) -> int:
        return self.loaded.vocab_size

    def new_state(self, seed: int | None) -> DraftSessionState:
        """A session's state; ``seed`` is the request's seed (the draft's own stream is derived from it)."""
        generator = draft_generator(request_seed(seed), self.loaded.device)
        return DraftSessionState(cache=new_cache(), generator=generator)

    def _sync(self, state: DraftSessionState, new_tokens: list[int], gamma: int) -> tuple[list[int], int]:
        """Append the newly committed tokens, crop rejected proposals from the cache; return (feed, gamma)."""
        state.committed.extend(new_tokens)
        committed = state.committed
        gamma = max(0, min(gamma, self.loaded.max_context - len(committed)))
        if gamma == 0 or not committed:
            return [], 0
        # Keep the cached prefix that agrees with the committed text; at least one token must be fed.
        keep = min(_common_prefix(state.cached, committed), len(committed) - 1)
        if keep < len(state.cached):
            state.cache.crop(keep)
            del state.cached[keep:]
        return committed[keep:], gamma

    def _choose(
        self, logits: torch.Tensor, params: SamplingParams, top_k: int, state: DraftSessionState, out: Proposal
    ) -> int:
        """Pick the next proposed token from ``logits [V]`` and record it (and its distribution) in ``out``."""
        d, ids, q = draw_proposal(logits, params, top_k, state.generator)
        if ids is not None and q is not None:
            out.q_ids.append(ids.tolist())
            out.q_probs.append(q.tolist())
        out.token_ids.append(d)
        return d

    def propose(
        self,
        state: DraftSessionState,
        new_tokens: list[int],
        gamma: int,
        params: SamplingParams,
        top_k: int,
    ) -> Proposal:
        """Append ``new_tokens`` to the session's committed text and propose up to ``gamma`` tokens."""
        proposal = Proposal(token_ids=[])
        with self._lock, torch.inference_mode():
            feed, gamma = self._sync(state, new_tokens, gamma)
            for step in range(gamma):
                logits = _forward(self.loaded.model, feed, state.cache)[-1]  # [V]
                state.cached.extend(feed)
                d = self._choose(logits, params, top_k, state, proposal)
                if step + 1 < gamma:
                    feed = [d]
        return proposal

    def propose_batch(self, requests: list[DraftRequest]) -> list[Proposal]:
        """Propose for several sessions with one forward pass per step (the sessions' caches stay apart).

        Each session's cache is left-padded to a common length and its new tokens right-padded to a common
        width; an attention mask hides the padding and explicit position ids keep every row at its own
        positions. After the last step each row's new keys and values go back into its own session's cache.
        """
        if len(requests) == 1:
            r = requests[0]
            return [self.propose(r.state, r.new_tokens, r.gamma, r.params, r.top_k)]
        proposals = [Proposal(token_ids=[]) for _ in requests]
        with self._lock, torch.inference_mode():
            rows: list[tuple[int, list[int], int]] = []  # (request index, feed, gamma)
            for i, r in enumerate(requests):
                feed, gamma = self._sync(r.state, r.new_tokens, r.gamma)
                if gamma:
                    rows.append((i, feed, gamma))
            if rows:
                self._batched_steps(requests, rows, proposals)
        return proposals

    def _batched_steps(
        self, requests: list[DraftRequest], rows: list[tuple[int, list[int], int]], proposals: list[Proposal]
    ) -> None:
        from starsd import kvcache

        states = [requests[i].state for i, _, _ in rows]
        cached = [len(s.cached) for s in states]
        widths = [len(feed) for _, feed, _ in rows]
        past, width, steps = max(cached), max(widths), max(g for _, _, g in rows)
        batch = len(rows)
        total = past + width + steps - 1  # every column this batch will hold
        layers = self.loaded.model.config.num_hidden_layers
        cache = kvcache.batch_cache([s.cache for s in states], cached, layers, total)
        # Row b: its cache right-aligned in [past - n, past), its feed from ``past`` (right-padded to
        # ``width``), then one column per drafting step; the mask marks the real columns.
        device = self.loaded.device
        mask = torch.zeros(batch, total, dtype=torch.bool)
        input_ids = torch.zeros(batch, width, dtype=torch.long)
        for b, ((_, feed, _), n) in enumerate(zip(rows, cached, strict=True)):
            mask[b, past - n : past + len(feed)] = True
            input_ids[b, : len(feed)] = torch.tensor(feed)
        mask, input_ids = mask.to(device), input_ids.to(device)
        base = torch.tensor(cached, device=device).unsqueeze(1)  # [B, 1]: each row's first new position
        positions = base + torch.arange(width, device=device)
        model = self.loaded.model
        filled = past + width
        logits = model(
            input_ids=input_ids,
            attention_mask=_attention_4d(mask[:, :filled], width),
            position_ids=positions,
            **kvcache.with_cache(cache),
        ).logits
        next_logits = logits[torch.arange(batch, device=device), torch.tensor(widths, device=device) - 1]  # [B, V]
        step_base = base + torch.tensor(widths, device=device).unsqueeze(1)  # [B, 1]: the first drafted position
        for step in range(steps):
            chosen = []
            for b, (i, _, gamma) in enumerate(rows):
                r = requests[i]
                if step < gamma:
                    chosen.append(self._choose(next_logits[b], r.params, r.top_k, r.state, proposals[i]))
                else:
                    chosen.append(0)
            if step + 1 == steps:
                break
            mask[:, filled] = True
            filled += 1
            out = model(
                input_ids=torch.tensor(chosen, device=device).unsqueeze(1),
                attention_mask=_attention_4d(mask[:, :filled], 1),
                position_ids=step_base + step,
                **kvcache.with_cache(cache),
            )
            next_logits = out.logits[:, -1]
        # Hand each row's new keys/values back to its own session: its feed, then the tokens it fed.
        for b, ((i, feed, gamma), s) in enumerate(zip(rows, states, strict=True)):
            fed_steps = gamma - 1  # the last proposal is never fed
            spans = [(past, past + len(feed)), (past + width, past + width + fed_steps)]
            kvcache.copy_row(cache, b, spans, s.cache, layers)
            s.cached.extend(feed)
            s.cached.extend(proposals[i].token_ids[:fed_steps])
