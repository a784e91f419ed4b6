"""The target's model step: one forward pass over every ready session, then one batched verification.

A step takes rows of different sessions. Each row feeds its uncached committed tokens (a new session's prompt,
or a chunk of it, or the tokens committed last round) followed by its drafts ``d_1..d_gamma``. Every session's
keys and values live in its own slot of one preallocated pool (:class:`starsd.kvcache.SlotPool`), left-aligned,
so a step copies no cache: the forward pass writes the new keys in place and attends its rows' slots. The feeds
are right-aligned in one padded batch, so that every row's last ``gamma + 1`` positions (the ones verification
needs) are the batch's last columns, and a 4-D mask hides the padding; the mask, positions and slot indices
are built on the device from one upload per pass (:func:`starsd.kvcache.step_inputs`), and the rows of a pass
run in slot order, so that the sessions in consecutive slots are attended where they lie. Rows of very
different widths (a long prompt chunk beside one-token decodes) run as separate forward passes in the same
step, so that decodes are not padded to a prompt's width.

Verification runs on the model's device for the whole step (:func:`starsd.sampling.verify_batch`) and the step
copies one small tensor to the host: each row's accepted count and last token. The per-sequence functions of
:mod:`starsd.sampling` are the reference the tests hold this to.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from starsd.checkpoints import LoadedModel
from starsd.cuda_graphs import reserve_bucket
from starsd.sampling import SamplingParams, dense_from_sparse, probs_batch, step_draws, verify_batch

log = logging.getLogger(__name__)

# Rows whose feed is at most this many times the narrowest row's (and at most NARROW_EXTRA wider) share a pass.
NARROW_EXTRA = 8


@dataclass
class TargetSession:
    """The target's state for one completion."""

    committed: list[int]  # prompt + generated tokens
    slot: Any = None  # starsd.kvcache.PoolSlot: its keys and values' row in the runner's pool, from its first step
    cached_len: int = 0  # committed[:cached_len] have keys/values in the slot

    @property
    def uncached(self) -> int:
        return len(self.committed) - self.cached_len


@dataclass
class StepRow:
    """One session's share of a step: a prefill chunk (``verify`` False) or a verification of its drafts."""

    session: TargetSession
    drafts: list[int] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator | None = None  # sampled rows: the session's own random stream
    q_ids: list[list[int]] = field(default_factory=list)  # sampled drafts: each position's top-k support
    q_probs: list[list[float]] = field(default_factory=list)
    prefill: int = 0  # prefill only: feed this many uncached committed tokens, verify nothing
    # The request's changes to the target's logits at the verified positions ``[gamma + 1, V] -> [gamma + 1, V]``
    # (top-k, min_tokens, penalties: see starsd.verifier.processing); verification then uses the changed ones.
    process: Callable[[torch.Tensor], torch.Tensor] | None = None
    logprobs: int | None = None  # report the emitted tokens' log-probabilities and this many top alternatives

    @property
    def verify(self) -> bool:
        return self.prefill == 0

    def feed(self) -> list[int]:
        s = self.session
        if not self.verify:
            return s.committed[s.cached_len : s.cached_len + self.prefill]
        return s.committed[s.cached_len :] + self.drafts


@dataclass(frozen=True)
class RowOutcome:
    accepted: int  # l: drafts accepted (0..gamma)
    tokens: list[int]  # the l accepted drafts and the recovered or bonus token (empty for a prefill chunk)
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the row asked for them


@dataclass(frozen=True)
class TokenLogprobs:
    """The target's log-probability of an emitted token and its most likely alternatives (the model's own
    distribution, before temperature and the request's logit changes, as vLLM reports by default)."""

    logprob: float
    top: list[tuple[int, float]]  # (token id, log-probability), most likely first


def width_groups(widths: list[int]) -> list[list[int]]:
    """Split row indices into forward passes of similar width (sorted by width; a new pass where padding would
    more than double the narrower rows' work)."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and widths[i] <= max(2 * widths[groups[-1][0]], widths[groups[-1][0]] + NARROW_EXTRA):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class TargetRunner:
    """Runs steps of many sessions on one target model (one step at a time): the model's
    :class:`starsd.verifier.step_runner.StepRunner`."""

    def __init__(self, loaded: LoadedModel, kv_tokens: int | None = None, cuda_graphs: str = "auto") -> None:
        """``kv_tokens``: the most key/value tokens (slots x capacity) the pool may hold; None: no bound.
        ``cuda_graphs``: ``auto`` (on with CUDA), ``on`` or ``off``: replay the verify steps (passes of at most
        :data:`starsd.cuda_graphs.MAX_WIDTH` positions) from captured CUDA graphs (see :mod:`starsd.cuda_graphs`)."""
        from starsd import kvcache  # imports transformers: only once a model is in use
        from starsd.cuda_graphs import StepGraphs, graphs_enabled
        from starsd.verifier.memory import kv_geometry

        self.loaded = loaded
        self.device = loaded.device
        self.vocab_size = loaded.vocab_size
        self._lock = threading.Lock()
        layers, heads, head_dim = kv_geometry(loaded.model.config)
        self.pool = kvcache.SlotPool(layers, heads, head_dim, loaded.placement.dtype, self.device, kv_tokens)
        params = inspect.signature(loaded.model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        kvcache.use_pool_attention(loaded.model)
        # starsd.cuda_graphs.StepGraphs over the pool, when graphs are used (None: every pass runs eagerly)
        self._graphs: StepGraphs | None = None
        if graphs_enabled(cuda_graphs, self.device):
            self._graphs = StepGraphs(loaded.model, self.pool, role="target")

    @property
    def graph_captures(self) -> int:
        """CUDA-graph buckets captured so far (0 when the steps run eagerly)."""
        return self._graphs.captures if self._graphs is not None else 0

    def new_session(self, prompt: list[int]) -> TargetSession:
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        return TargetSession(committed=list(prompt))

    def release(self, session: TargetSession) -> None:
        """Free a finished session's slot (a session dropped without this is freed when collected)."""
        if session.slot is not None:
            session.slot.release()
            session.slot = None

    def step(self, rows: list[StepRow]) -> list[RowOutcome]:
        """Forward every row, verify the verifying rows together, commit each; one outcome per row, in order."""
        feeds = [row.feed() for row in rows]
        if not rows:
            return []
        if any(not f for f in feeds):
            raise ValueError("every row of a step must feed at least one token")
        keep = 1 + max((len(r.drafts) for r in rows if r.verify), default=0)  # positions verification needs
        logits: list[torch.Tensor] = [torch.empty(0)] * len(rows)  # every row's is set by its forward pass
        with self._lock, torch.inference_mode():
            need = 1 + max(r.session.cached_len + len(f) for r, f in zip(rows, feeds, strict=True))
            try:
                self._place(rows, need)
            except MemoryError:
                if self._graphs is None:
                    raise
                # The graphs' scratch slot is what the pool's bound cannot fit: give it up, run eagerly from now on.
                log.warning("the key/value pool's bound leaves no room for the CUDA graphs' scratch slot; eager steps")
                self._graphs.close()
                self._graphs = None
                self._place(rows, need)
            if self._graphs is not None:
                reserve_bucket(self.pool, need)
            slots = self.pool.rows_of([r.session.slot for r in rows])
            for group in width_groups([len(f) for f in feeds]):
                group.sort(key=lambda i: slots[i])  # rows in slot order: consecutive slots are read in place
                out = self._forward(
                    [rows[i] for i in group], [feeds[i] for i in group], [slots[i] for i in group], keep
                )
                for j, i in enumerate(group):
                    logits[i] = out[j]
            verifying = [i for i, r in enumerate(rows) if r.verify]
            decided = self._verify([rows[i] for i in verifying], [logits[i] for i in verifying], keep)
            outcomes = [RowOutcome(0, []) for _ in rows]
            for i, (accepted, last) in zip(verifying, decided, strict=True):
                outcomes[i] = RowOutcome(accepted, [*rows[i].drafts[:accepted], last])
            wanted = [i for i in verifying if rows[i].logprobs is not None]
            if wanted:
                top = max(rows[i].logprobs or 0 for i in wanted)
                reported = emitted_logprobs(
                    [logits[i][..., : self.loaded.vocab_size] for i in wanted],
                    [len(rows[i].drafts) for i in wanted],
                    [outcomes[i].tokens for i in wanted],
                    top,
                )
                for i, entries in zip(wanted, reported, strict=True):
                    k = rows[i].logprobs or 0
                    entries = [TokenLogprobs(e.logprob, e.top[:k]) for e in entries]
                    outcomes[i] = RowOutcome(outcomes[i].accepted, outcomes[i].tokens, entries)
        for row, outcome in zip(rows, outcomes, strict=True):
            commit(row, outcome)
        return outcomes

    def _place(self, rows: list[StepRow], need: int) -> None:
        """Give every row's session a slot and make the slots hold ``need`` columns."""
        for row in rows:
            if row.session.slot is None:
                row.session.slot = self.pool.take()
        self.pool.reserve(need)

    def _forward(self, rows: list[StepRow], feeds: list[list[int]], slots: list[int], keep: int) -> torch.Tensor:
        """One forward pass over rows held in pool rows ``slots``; returns logits ``[B, keep, V]`` at each row's
        last ``keep`` positions (a row with fewer positions repeats its first; only its own last ``gamma + 1``
        are read). Its inputs go to the device in one copy (:func:`starsd.kvcache.step_inputs`)."""
        from starsd import cuda_graphs, kvcache  # imports transformers: only once a model is in use

        cached = [r.session.cached_len for r in rows]
        widths = [len(f) for f in feeds]
        width = max(widths)
        graphs = self._graphs if width <= cuda_graphs.MAX_WIDTH else None  # prompt chunks run eagerly
        inputs = kvcache.step_inputs(feeds, slots, cached, widths, self.device, graphs is not None)
        cache = self.pool.step_cache([r.session.slot for r in rows], cached, widths, inputs)  # also the extents
        if graphs is not None:
            replayed = _replayed(graphs, inputs, min(keep, width))
            if replayed is not None:
                return _last_positions(replayed, [width] * len(rows), keep)
        kwargs: dict[str, Any] = inputs.model_kwargs()
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = min(keep, width)
        out = self.loaded.model(
            input_ids=inputs.input_ids,
            use_cache=True,
            **kvcache.with_cache(cache),
            **kwargs,
        ).logits
        return _last_positions(out, [width] * len(rows), keep)

    def _verify(self, rows: list[StepRow], logits: list[torch.Tensor], keep: int) -> list[tuple[int, int]]:
        """Verify every row at once on the device; one host copy for the whole step."""
        from starsd import kvcache

        if not rows:
            return []
        width = keep - 1
        vocab = self.loaded.vocab_size
        device = self.device
        gammas = [len(r.drafts) for r in rows]
        # Row b's verified positions are the last gamma_b + 1 of its ``keep``; shift them to the front.
        target_logits = torch.stack(
            [_front(row_logits, g + 1) for row_logits, g in zip(logits, gammas, strict=True)]
        )  # [B, keep, V]
        target_logits = processed_logits(rows, gammas, target_logits[..., :vocab])
        packed = [*gammas]
        for r in rows:
            packed.extend(r.drafts)
            packed.extend([0] * (width - len(r.drafts)))
        values = kvcache.upload(packed, device)  # the verification's one host-to-device copy
        gamma_t, drafts = values[: len(rows)], values[len(rows) :].view(len(rows), width)
        if all(r.params.greedy for r in rows):  # the common case needs no distributions: argmax only
            accepted, last = greedy_verdict(drafts, gamma_t, target_logits[..., :vocab])
            pairs = torch.stack([accepted, last]).tolist()  # the step's one device-to-host copy
            return list(zip(pairs[0], pairs[1], strict=True))
        target_probs = probs_batch(target_logits[..., :vocab], [r.params for r in rows])
        draft_probs = _draft_distributions(rows, drafts, width, vocab, device)
        generators = [None if r.params.greedy else r.generator for r in rows]
        uniforms, races = step_draws(gammas, width, vocab, generators, device)
        verdict = verify_batch(drafts, gamma_t, draft_probs, target_probs, uniforms, races)
        pairs = torch.stack([verdict.accepted, verdict.last]).tolist()  # the step's one device-to-host copy
        return list(zip(pairs[0], pairs[1], strict=True))


def commit(row: StepRow, outcome: RowOutcome) -> None:
    """The commit rule of every step runner: a prefill chunk joins the session's cache; a verified row drops the
    rejected drafts from the cached length and appends the committed tokens."""
    session = row.session
    if not row.verify:
        session.cached_len += row.prefill
        return
    # The slot holds committed + all drafts; the rejected drafts' columns are overwritten by later steps.
    session.cached_len = len(session.committed) + outcome.accepted
    session.committed.extend(outcome.tokens)


def processed_logits(rows: list[StepRow], gammas: list[int], logits: torch.Tensor) -> torch.Tensor:
    """``logits [B, keep, V]`` (verified positions first) with each row's own :attr:`StepRow.process` applied."""
    if all(r.process is None for r in rows):
        return logits
    logits = logits.clone()
    for b, (row, gamma) in enumerate(zip(rows, gammas, strict=True)):
        if row.process is not None:
            logits[b, : gamma + 1] = row.process(logits[b, : gamma + 1])
    return logits


def emitted_logprobs(
    logits: list[torch.Tensor], gammas: list[int], tokens: list[list[int]], top: int
) -> list[list[TokenLogprobs]]:
    """Each row's log-probabilities of its emitted ``tokens`` and of its ``top`` most likely alternatives, from
    its raw verify logits ``[keep, V]``: a row with ``gamma`` drafts verified its last ``gamma + 1`` positions,
    and emitted token ``j`` was chosen at the ``j``-th of them. One device-to-host copy for all rows."""
    width = max(len(t) for t in tokens)
    device = logits[0].device
    verified = []
    index = torch.zeros(len(tokens), width, dtype=torch.long)
    for b, (row_logits, gamma, row_tokens) in enumerate(zip(logits, gammas, tokens, strict=True)):
        positions = row_logits[row_logits.shape[0] - (gamma + 1) :][: len(row_tokens)]
        pad = width - positions.shape[0]
        verified.append(torch.cat([positions, positions[:1].expand(pad, -1)]) if pad else positions)
        index[b, : len(row_tokens)] = torch.tensor(row_tokens)
    logp = torch.log_softmax(torch.stack(verified).float(), dim=-1)  # [B, width, V]
    chosen = logp.gather(-1, index.to(device).unsqueeze(-1)).squeeze(-1)  # [B, width]
    top_values, top_ids = logp.topk(max(top, 1), dim=-1)  # [B, width, top]
    chosen_h, values_h, ids_h = chosen.tolist(), top_values.tolist(), top_ids.tolist()
    return [
        [
            TokenLogprobs(chosen_h[b][j], list(zip(ids_h[b][j][:top], values_h[b][j][:top], strict=True)))
            for j in range(len(row_tokens))
        ]
        for b, row_tokens in enumerate(tokens)
    ]


def greedy_verdict(
    drafts: torch.Tensor, gammas: torch.Tensor, target_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of a step: ``(accepted [B], last [B])``, what :func:`verify_batch` gives for one-hot
    distributions (drafts accepted while they equal the target's argmax, then the target's argmax)."""
    argmax = target_logits.argmax(dim=-1)  # [B, G + 1]
    width = drafts.shape[1]
    live = torch.arange(width, device=drafts.device).unsqueeze(0) < gammas.unsqueeze(1)
    ok = (drafts == argmax[:, :width]) & live
    accepted = ok.long().cumprod(dim=-1).sum(dim=-1)
    return accepted, argmax.gather(1, accepted.unsqueeze(1)).squeeze(1)


def _replayed(graphs: Any, inputs: Any, keep: int) -> torch.Tensor | None:
    """A pass's logits ``[B, keep, V]`` replayed from ``graphs`` (a :class:`starsd.cuda_graphs.StepGraphs`), copied
    out of the graph's output (a later pass of the same bucket overwrites it); None: run the pass eagerly."""
    if inputs.input_ids is None or inputs.positions is None or inputs.columns is None or inputs.mask is None:
        return None
    out = graphs.step_logits(inputs.input_ids, inputs.rows, inputs.positions, inputs.columns, inputs.mask, keep)
    return None if out is None else out.clone()


def _last_positions(logits: torch.Tensor, widths: list[int], keep: int) -> torch.Tensor:
    """``[B, keep, V]``: the last ``keep`` positions of each row (rows of fewer positions padded at the front)."""
    if logits.shape[1] >= keep:
        return logits[:, -keep:]
    pad = logits[:, :1].expand(-1, keep - logits.shape[1], -1)
    return torch.cat([pad, logits], dim=1)


def _front(row_logits: torch.Tensor, n: int) -> torch.Tensor:
    """Move a row's last ``n`` positions to the front of its ``[keep, V]`` (the rest is padding)."""
    keep = row_logits.shape[0]
    if n == keep:
        return row_logits
    return torch.cat([row_logits[keep - n :], row_logits[: keep - n]], dim=0)


def _draft_distributions(
    rows: list[StepRow], drafts: torch.Tensor, width: int, vocab: int, device: torch.device
) -> torch.Tensor:
    """``q [B, width, V]``: the reported top-k distributions of sampled drafts, one-hot for greedy drafts."""
    q = torch.nn.functional.one_hot(drafts, vocab).float() if width else torch.zeros(len(rows), 0, vocab)
    q = q.to(device)
    sampled = [b for b, r in enumerate(rows) if r.drafts and not r.params.greedy]
    if sampled:
        k = max(len(ids) for b in sampled for ids in rows[b].q_ids)
        ids = torch.full((len(sampled), width, k), -1, dtype=torch.long)
        probs = torch.zeros(len(sampled), width, k)
        for j, b in enumerate(sampled):
            for i, (row_ids, row_probs) in enumerate(zip(rows[b].q_ids, rows[b].q_probs, strict=True)):
                ids[j, i, : len(row_ids)] = torch.tensor(row_ids)
                probs[j, i, : len(row_probs)] = torch.tensor(row_probs)
        dense = dense_from_sparse(ids.to(device), probs.to(device), vocab)  # [S, width, V]
        gammas = torch.tensor([len(rows[b].drafts) for b in sampled], device=device)
        live = (torch.arange(width, device=device).unsqueeze(0) < gammas.unsqueeze(1)).unsqueeze(-1)
        q[torch.tensor(sampled, device=device)] = torch.where(live, dense, q[torch.tensor(sampled, device=device)])
    return q
