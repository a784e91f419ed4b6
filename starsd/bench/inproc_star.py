"""A star in one process on one device: a draft's batched proposals feeding N targets' verify steps, with real
forward passes, against the same targets decoding alone and against the system model.

Every operation is real and timed on its own (device synchronised): one :meth:`DraftRunner.propose_batch` for the
requests waiting at the draft, one :meth:`TargetRunner.step` per target (one session each, ``context`` tokens
cached). The targets take turns on the one device, and the star's timeline is composed from the measured
durations as if each target had a device of its own (what a star is): the draft serves whatever requests are
waiting when it is free, a target's next request arrives when its verify step ends (in-process: no transfer
time). Random weights accept nothing, so acceptance is forced after the real forward pass: each row's logits are
changed (the :attr:`StepRow.process` hook) so that greedy verification accepts exactly ``l`` drafts, with ``l``
following ``P(l >= y) = alpha^y`` through a low-discrepancy sequence (its mean converges fast, so a few rounds
give the model's ``E[l]``); the draft then sees the committed tokens and crops its rejected proposals as in
serving. Decoding alone, each target steps one token at a time: ``N / Tp1`` tokens per second for N targets.

The prediction is the system model's :func:`starsd.system_model.batched_point` with the draft batching all N
requests, fed with ``Tq(B)``, ``Tp`` measured elsewhere (``bench step``) when given, else with this run's means.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from starsd import system_model

GOLDEN = (math.sqrt(5) - 1) / 2


def forced_accepts(count: int, gamma: int, alpha: float, offset: float = 0.5) -> list[int]:
    """``count`` accepted lengths with ``P(l >= y) = alpha^y`` (capped at ``gamma``): ``l = floor(log u / log
    alpha)`` for the golden-ratio sequence ``u`` in (0, 1), so the sample mean is close to ``E[l]`` already for
    a few dozen rounds."""
    out = []
    for t in range(count):
        u = (offset + (t + 1) * GOLDEN) % 1.0 or 0.5
        out.append(min(gamma, int(math.log(u) / math.log(alpha))) if alpha > 0 else 0)
    return out


def forcing(drafts: list[int], accept: int) -> Callable[[Any], Any]:
    """A :attr:`StepRow.process` that makes greedy verification accept exactly ``accept`` of ``drafts``: each
    accepted draft becomes its position's argmax, the first rejected one its position's least likely token."""

    def process(logits: Any) -> Any:  # [gamma + 1, V]
        logits = logits.clone()
        for j, d in enumerate(drafts[: accept + 1]):
            logits[j, d] = float("inf") if j < accept else float("-inf")
        return logits

    return process


@dataclass
class StarPoint:
    targets: int
    mode: str  # eager, or graphs
    rounds: int  # per target
    tokens: int
    seconds: float  # the composed timeline's length
    tokens_per_s: float
    alone_tokens_per_s: float  # the same targets decoding alone: N / Tp1
    speedup: float
    mean_accepted: float
    tq_ms: float  # median measured Tq(B = N) in this run
    tp_ms: float  # median measured verify step
    tp1_ms: float  # median measured decode step
    draft_busy: float  # the draft's busy fraction on the timeline
    predicted_tokens_per_s: float
    measured_over_model: float
    prediction_from: str


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def run_point(
    draft_loaded: Any,
    target_loaded: Any,
    n: int,
    gamma: int,
    alpha: float,
    context: int,
    rounds: int,
    prediction: tuple[system_model.BatchCurve, float] | None = None,
    seed: int = 0,
    mode: str = "eager",
) -> StarPoint:
    """One star of ``n`` targets for ``rounds`` rounds each (see the module's docstring), the runners in ``mode``
    (``eager``, or ``graphs`` where they have CUDA graphs: see :func:`starsd.bench.step.runner_options`)."""
    import torch

    from starsd.bench.step import graphs_parameter, runner_options
    from starsd.draft.runner import DraftRunner
    from starsd.proposals import DraftRequest, SamplingParams
    from starsd.verifier.runner import StepRow, TargetRunner

    def options(cls: type) -> dict[str, Any]:
        return runner_options(cls, mode) if graphs_parameter(cls) is not None or mode == "graphs" else {}

    device = target_loaded.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rng = random.Random(seed)
    vocab = min(draft_loaded.vocab_size, target_loaded.vocab_size)
    draft = DraftRunner(draft_loaded, **options(DraftRunner))
    targets = [TargetRunner(target_loaded, **options(TargetRunner)) for _ in range(n)]
    prompts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(n)]
    sessions = [t.new_session(p) for t, p in zip(targets, prompts, strict=True)]
    for t, s in zip(targets, sessions, strict=True):
        t.step([StepRow(s, prefill=context - 1)])
    states = [draft.new_state(seed=i) for i in range(n)]
    pending = [list(p) for p in prompts]  # committed tokens the draft has not seen
    accepts = forced_accepts(n * (rounds + 2), gamma, alpha, offset=rng.random())
    params = SamplingParams()

    def draft_pass(batch: list[int]) -> tuple[list[list[int]], float]:
        requests = [DraftRequest(states[i], pending[i], gamma, params, 0) for i in batch]
        proposals, seconds = _timed(lambda: draft.propose_batch(requests), sync)
        return [p.token_ids for p in proposals], seconds

    def verify(i: int, drafts: list[int]) -> tuple[list[int], float]:
        row = StepRow(sessions[i], drafts=drafts, process=forcing(drafts, accepts.pop()))
        outcome, seconds = _timed(lambda: targets[i].step([row])[0], sync)
        return list(outcome.tokens), seconds

    # One untimed round for every target (the prompts' prefill at the draft, and warm-up).
    proposals, _ = draft_pass(list(range(n)))
    for i, drafts in enumerate(proposals):
        pending[i] = verify(i, drafts)[0]
    arrival, free, busy = [0.0] * n, 0.0, 0.0
    done, tokens, accepted = [0] * n, 0, 0
    tq_times: list[float] = []
    tp_times: list[float] = []
    while min(done) < rounds:
        start = max(free, min(arrival[i] for i in range(n) if done[i] < rounds))
        batch = [i for i in range(n) if done[i] < rounds and arrival[i] <= start]
        proposals, tq = draft_pass(batch)
        if len(batch) == n:
            tq_times.append(tq)
        free, busy = start + tq, busy + tq
        for i, drafts in zip(batch, proposals, strict=True):
            committed, tp = verify(i, drafts)
            tp_times.append(tp)
            pending[i] = committed
            tokens += len(committed)
            accepted += len(committed) - 1
            arrival[i] = free + tp
            done[i] += 1
    seconds = max(arrival)
    decode_times = [
        _timed(lambda: targets[0].step([StepRow(sessions[0])]), sync)[1] for _ in range(max(3, rounds // 2))
    ]
    tp1 = statistics.median(decode_times)
    tq_n = statistics.median(tq_times) if tq_times else statistics.median([tq])
    tp_med = statistics.median(tp_times)
    if prediction is not None and prediction[0].max_batch >= n:
        curve, tp_model = prediction
        source = "bench step: Tq(B), Tp(gamma, 1)"
    else:
        # The timeline is the sum of this run's durations, so its means (not medians) are what it composes.
        tq_mean = statistics.fmean(tq_times) if tq_times else tq
        curve = system_model.BatchCurve(((1, tq_mean),) if n == 1 else ((1, tq_mean), (n, tq_mean)))
        tp_model, source = statistics.fmean(tp_times), "this run's means"
    predicted = system_model.batched_point(n, curve, tp_model, 0.0, gamma, alpha=alpha, batch=n).throughput
    for t, s in zip(targets, sessions, strict=True):
        t.release(s)
    rate = tokens / seconds
    alone = n / tp1
    return StarPoint(
        targets=n,
        mode=mode,
        rounds=rounds,
        tokens=tokens,
        seconds=round(seconds, 6),
        tokens_per_s=round(rate, 3),
        alone_tokens_per_s=round(alone, 3),
        speedup=round(rate / alone, 4),
        mean_accepted=round(accepted / (rounds * n), 4),
        tq_ms=round(tq_n * 1e3, 4),
        tp_ms=round(tp_med * 1e3, 4),
        tp1_ms=round(tp1 * 1e3, 4),
        draft_busy=round(busy / seconds, 4),
        predicted_tokens_per_s=round(predicted, 3),
        measured_over_model=round(rate / predicted, 4),
        prediction_from=source,
    )


def point_dict(p: StarPoint) -> dict[str, Any]:
    return asdict(p)
