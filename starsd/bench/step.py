"""``starsd bench step``: time one target step and one draft step of StarSD's own runners, on any device.

For each batch size ``B``, ``gamma`` and context, a *target step* is one :meth:`TargetRunner.step` of ``B`` rows,
each verifying ``gamma`` random drafts after one committed token (the serving loop's steady state), and a *draft
step* is one :meth:`DraftRunner.propose_batch` of ``B`` sessions, ``gamma`` greedy tokens each after one newly
committed token that rejected the last proposal. Sessions are prefilled with ``context`` tokens once per
context (so a session's context grows by the tokens each timed step commits: the table reports the mean
context at the start of each measurement). Rows are either *consecutive* (the first ``B`` sessions in the order
they took their slots) or *shuffled* (``B`` sessions drawn at random from all, in random order: what a server
sees when rows come in arrival order).

Each configuration runs ``warmup`` untimed steps, one step under the host-sync counter
(:mod:`starsd.bench.syncs`) and the operator counter, one step under the CUDA profiler (on CUDA: the device's
kernel time, :mod:`starsd.bench.device_work`), then ``repeats`` timed steps: wall time with the device
synchronised after each step and, on CUDA, the time between two CUDA events around it. Where CUDA time is far
above kernel time, the device waits for the host: the step is bound by launches, not by the device. Where the
runners take ``cuda_graphs`` (the CUDA-graph step), mode ``graphs`` times them with it on and ``eager`` with it
off; otherwise only ``eager`` exists; a graphs row counts the buckets captured after the warm-up (each capture
runs eager steps, so a row whose count is not 0 times some of them).

Results are written after every configuration (``--json``), so a run that is cut off or runs out of ``--budget``
keeps what it measured. Only this module's functions import torch, and only when they run.
"""

from __future__ import annotations

import inspect
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("target", "draft")
SLOTS = ("consecutive", "shuffled")
MODES = ("eager", "graphs")
PREFILL_TOKENS = 16384  # tokens per prefill call while preparing sessions (bounds the prefill's activations)
INSPECTED = 2  # untimed steps per configuration after the warm-up: syncs and operators, then kernel time


@dataclass(frozen=True)
class StepPlan:
    """What to time."""

    draft: str = "llama-1b"  # a measure_gpu shape or a checkpoint directory
    target: str = "llama-8b"
    roles: tuple[str, ...] = ROLES
    batches: tuple[int, ...] = (1, 4, 16, 32, 64)
    gammas: tuple[int, ...] = (2, 4, 8)
    contexts: tuple[int, ...] = (128, 1024)
    slots: tuple[str, ...] = SLOTS
    modes: tuple[str, ...] = MODES
    device: str = "auto"
    dtype: str = "auto"
    warmup: int = 2
    repeats: int = 5
    budget: float | None = None  # seconds (each role its share); configurations not started in time are skipped
    seed: int = 0

    def check(self) -> None:
        if min(self.batches, default=0) < 1 or min(self.contexts, default=0) < 2:
            raise ValueError("batches must be >= 1 and contexts >= 2")
        if min(self.gammas, default=-1) < 0 or self.repeats < 1 or self.warmup < 0:
            raise ValueError("gammas must be >= 0, repeats >= 1 and warmup >= 0")
        for name, given, known in (
            ("role", self.roles, ROLES),
            ("slots", self.slots, SLOTS),
            ("mode", self.modes, MODES),
        ):
            bad = [x for x in given if x not in known]
            if bad or not given:
                raise ValueError(f"{name} must be among {', '.join(known)}, got {', '.join(given) or 'none'}")

    def needed_positions(self) -> int:
        """The longest a session can get: its context, then at most ``gamma + 1`` tokens per step it is in."""
        steps = len(self.batches) * len(self.gammas) * len(self.slots) * (self.warmup + INSPECTED + self.repeats)
        return max(self.contexts) + steps * (max(self.gammas) + 1) + max(self.gammas) + 1


@dataclass
class StepTiming:
    """One configuration's times (milliseconds, medians of the repeats)."""

    role: str
    model: str
    mode: str
    context: int
    gamma: int
    batch: int
    slots: str
    wall_ms: float
    wall_ms_min: float
    cuda_ms: float | None  # CUDA-event time; None off CUDA
    syncs: int  # host synchronisations in one step (see starsd.bench.syncs)
    context_mean: float  # the rows' mean cached context when the measurement started
    ops: int = 0  # operators the host dispatched in one step (see starsd.bench.device_work)
    kernel_ms: float | None = None  # the device's kernel and copy time in one step; None off CUDA
    captures: int | None = None  # CUDA-graph buckets captured after the warm-up (graphs mode; None: eager)


@dataclass
class StepReport:
    plan: StepPlan
    device: str = ""
    dtype: str = ""
    hardware: str = ""
    torch_version: str = ""
    sync_method: str = ""
    graphs_available: dict[str, bool] = field(default_factory=dict)
    rows: list[StepTiming] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    complete: bool = False
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["benchmark"] = "step"
        return data

    def find(self, role: str, gamma: int, batch: int, **match: Any) -> StepTiming | None:
        """The first row with these values (``mode``, ``context``, ``slots`` optional)."""
        for row in self.rows:
            if (row.role, row.gamma, row.batch) == (role, gamma, batch) and all(
                getattr(row, k) == v for k, v in match.items()
            ):
                return row
        return None

    def table(self) -> str:
        head = f"{'role':<7}{'mode':<8}{'ctx':>6}{'gamma':>6}{'B':>4} {'slots':<12}"
        head += f"{'wall ms':>9}{'cuda ms':>9}{'kernel ms':>10}{'syncs':>6}{'ops':>7}"
        lines = [f"bench step on {self.hardware} ({self.dtype}, torch {self.torch_version})", head]
        for r in self.rows:
            cuda = f"{r.cuda_ms:9.3f}" if r.cuda_ms is not None else f"{'-':>9}"
            kernel = f"{r.kernel_ms:10.3f}" if r.kernel_ms is not None else f"{'-':>10}"
            captured = f"  ({r.captures} captured while measured)" if r.captures else ""
            lines.append(
                f"{r.role:<7}{r.mode:<8}{r.context:>6}{r.gamma:>6}{r.batch:>4} {r.slots:<12}{r.wall_ms:9.3f}{cuda}"
                f"{kernel}{r.syncs:>6}{r.ops:>7}{captured}"
            )
        if self.skipped:
            lines.append(f"skipped: {'; '.join(self.skipped)}")
        return "\n".join(lines)


def graphs_parameter(cls: type) -> inspect.Parameter | None:
    """The runner's ``cuda_graphs`` parameter, where the runner has one."""
    return inspect.signature(cls.__init__).parameters.get("cuda_graphs")  # type: ignore[misc]


def runner_options(cls: type, mode: str) -> dict[str, Any]:
    """Keyword arguments that put a runner in ``mode`` (``eager``/``graphs``): ``cuda_graphs`` off or on, in
    the parameter's own type (``"off"``/``"on"`` for a string option, False/True for a flag)."""
    param = graphs_parameter(cls)
    if param is None:
        if mode == "graphs":
            raise ValueError(f"{cls.__name__} has no cuda_graphs option")
        return {}
    on = mode == "graphs"
    if isinstance(param.default, bool):
        return {"cuda_graphs": on}
    return {"cuda_graphs": "on" if on else "off"}


class _Clock:
    """Wall time with the device synchronised, and CUDA-event time on CUDA."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.device = device
        self._torch = torch

    def sync(self) -> None:
        if self.cuda:
            self._torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], object]) -> tuple[float, float | None]:
        torch = self._torch
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start, None
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        start = time.perf_counter()
        begin.record()
        fn()
        end.record()
        self.sync()
        return time.perf_counter() - start, begin.elapsed_time(end) / 1e3


def _ids(vocab: int, n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _rows_for(sessions: list[Any], batch: int, slots: str, rng: random.Random) -> list[Any]:
    if slots == "consecutive":
        return sessions[:batch]
    return rng.sample(sessions, batch)


class _TargetBench:
    """Sessions on one target runner, prefilled; ``step(rows, gamma)`` is one verify step."""

    def __init__(self, loaded: Any, mode: str, count: int, context: int, rng: random.Random) -> None:
        from starsd.verifier.runner import StepRow, TargetRunner

        self._row = StepRow
        self.vocab, self.rng = loaded.vocab_size, rng
        self.runner = TargetRunner(loaded, **runner_options(TargetRunner, mode))
        self.sessions = [self.runner.new_session(_ids(self.vocab, context, rng)) for _ in range(count)]
        self.length = {id(s): context - 1 for s in self.sessions}  # cached tokens, counted from the outcomes
        chunk = max(1, PREFILL_TOKENS // context)
        for i in range(0, count, chunk):  # slots are taken in this order: sessions[i] holds slot i
            self.runner.step([StepRow(s, prefill=context - 1) for s in self.sessions[i : i + chunk]])

    def step(self, rows: list[Any], gamma: int) -> None:
        outcomes = self.runner.step([self._row(s, drafts=_ids(self.vocab, gamma, self.rng)) for s in rows])
        for s, outcome in zip(rows, outcomes, strict=True):
            self.length[id(s)] += len(outcome.tokens)

    def context(self, rows: list[Any]) -> float:
        return statistics.fmean(self.length[id(s)] for s in rows)

    def close(self) -> None:
        for s in self.sessions:
            self.runner.release(s)


class _DraftBench:
    """Sessions on one draft runner, prefilled; ``step(rows, gamma)`` is one batched proposal round."""

    def __init__(self, loaded: Any, mode: str, count: int, context: int, rng: random.Random) -> None:
        from starsd.draft.runner import DraftRunner
        from starsd.proposals import DraftRequest, SamplingParams

        self._request, self._params = DraftRequest, SamplingParams()
        self.vocab = loaded.vocab_size
        self.runner = DraftRunner(loaded, **runner_options(DraftRunner, mode))
        self.sessions = [self.runner.new_state(seed=i) for i in range(count)]
        self.last: dict[int, int] = {}  # id(session) -> its last proposal's first token
        self.length: dict[int, int] = {}  # id(session) -> committed tokens
        chunk = max(1, min(8, PREFILL_TOKENS // context))  # a prefill's logits cover every fed position
        for i in range(0, count, chunk):
            group = self.sessions[i : i + chunk]
            self._propose([(s, _ids(self.vocab, context, rng)) for s in group], 1)

    def _propose(self, feeds: list[tuple[Any, list[int]]], gamma: int) -> None:
        requests = [self._request(s, new, gamma, self._params, 0) for s, new in feeds]
        for (s, new), proposal in zip(feeds, self.runner.propose_batch(requests), strict=True):
            self.length[id(s)] = self.length.get(id(s), 0) + len(new)
            self.last[id(s)] = proposal.token_ids[0] if proposal.token_ids else 0

    def step(self, rows: list[Any], gamma: int) -> None:
        # The target rejected each row's first proposal and committed a token of its own instead.
        self._propose([(s, [(self.last[id(s)] + 1) % self.vocab]) for s in rows], gamma)

    def context(self, rows: list[Any]) -> float:
        return statistics.fmean(self.length[id(s)] for s in rows)

    def close(self) -> None:
        self.sessions.clear()


def _configs(plan: StepPlan) -> Iterator[tuple[int, str, int]]:
    """(gamma, slots, B) in the order they are measured: gamma 4 first (the profile's), then the others."""
    gammas = sorted(plan.gammas, key=lambda g: (g != 4, g))
    for gamma in gammas:
        for slots in plan.slots:
            for batch in plan.batches:
                if slots == "shuffled" and batch == 1 and "consecutive" in plan.slots:
                    continue  # one row is one slot: the same step as consecutive
                yield gamma, slots, batch


def _measure(
    bench: _TargetBench | _DraftBench, rows: list[Any], gamma: int, plan: StepPlan, clock: _Clock, mode: str
) -> Any:
    """Warm up, count one step's host syncs and operators, take one step's kernel time (CUDA), then time
    ``plan.repeats`` steps: StepTiming's measured fields."""
    from starsd.bench.device_work import count_ops, kernel_seconds
    from starsd.bench.syncs import count_syncs

    for _ in range(plan.warmup):
        bench.step(rows, gamma)
    captured = bench.runner.graph_captures
    clock.sync()
    with count_syncs(clock.device) as syncs, count_ops() as ops:
        bench.step(rows, gamma)
    clock.sync()
    kernel = kernel_seconds(lambda: bench.step(rows, gamma), clock.device)
    context_mean = bench.context(rows)
    times = [clock.time(lambda: bench.step(rows, gamma)) for _ in range(plan.repeats)]
    walls = [w for w, _ in times]
    cudas = [c for _, c in times if c is not None]
    return {
        "wall_ms": round(statistics.median(walls) * 1e3, 4),
        "wall_ms_min": round(min(walls) * 1e3, 4),
        "cuda_ms": round(statistics.median(cudas) * 1e3, 4) if cudas else None,
        "syncs": syncs.count,
        "context_mean": round(context_mean, 1),
        "ops": ops.count,
        "kernel_ms": round(kernel * 1e3, 4) if kernel is not None else None,
        "captures": bench.runner.graph_captures - captured if mode == "graphs" else None,
    }


def run_step_bench(
    plan: StepPlan,
    progress: Callable[[str], None] = lambda _: None,
    write: Callable[[StepReport], None] = lambda _: None,
) -> StepReport:
    """Measure every configuration of ``plan`` (see the module's docstring); ``write`` hears the report after each
    one, ``progress`` a line per configuration."""
    import torch

    from starsd.bench.measure_gpu import describe, load_model
    from starsd.bench.syncs import sync_method
    from starsd.draft.runner import DraftRunner
    from starsd.verifier.runner import TargetRunner

    plan.check()
    started = time.perf_counter()
    report = StepReport(plan, torch_version=torch.__version__)
    report.graphs_available = {
        "target": graphs_parameter(TargetRunner) is not None,
        "draft": graphs_parameter(DraftRunner) is not None,
    }
    rng = random.Random(plan.seed)

    share = 0

    def over_budget() -> bool:  # each role may spend its share of the budget and what earlier roles left
        return plan.budget is not None and time.perf_counter() - started > plan.budget * share / len(plan.roles)

    for role in plan.roles:
        share += 1
        model = plan.target if role == "target" else plan.draft
        progress(f"{role}: loading {describe(model)}")
        loaded = load_model(model, plan.device, plan.dtype)
        if loaded.max_context < plan.needed_positions():
            raise ValueError(
                f"{describe(model)} holds {loaded.max_context} positions; this plan needs {plan.needed_positions()}"
            )
        device = loaded.device
        report.device, report.dtype = str(device), str(loaded.placement.dtype).removeprefix("torch.")
        report.hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        clock = _Clock(device)
        modes = []
        for mode in plan.modes:
            if mode == "graphs" and (device.type != "cuda" or not report.graphs_available[role]):
                report.skipped.append(f"{role} graphs: {'not on CUDA' if device.type != 'cuda' else 'no option'}")
            else:
                modes.append(mode)
        for context in plan.contexts:
            if over_budget():
                report.skipped.append(f"{role} context {context}: out of budget")
                continue
            maker = _TargetBench if role == "target" else _DraftBench
            progress(f"{role} context {context}: preparing {max(plan.batches)} sessions ({', '.join(modes)})")
            benches = {mode: maker(loaded, mode, max(plan.batches), context, rng) for mode in modes}
            for gamma, slots, batch in _configs(plan):
                for mode, bench in benches.items():  # modes side by side: a cut-off run keeps comparable pairs
                    if over_budget():
                        report.skipped.append(f"{role} {mode} context {context} gamma {gamma} B={batch} {slots}")
                        continue
                    rows = _rows_for(bench.sessions, batch, slots, rng)
                    measured = _measure(bench, rows, gamma, plan, clock, mode)
                    timing = StepTiming(role, describe(model), mode, context, gamma, batch, slots, **measured)
                    report.sync_method = sync_method(device)
                    report.rows.append(timing)
                    report.elapsed_s = round(time.perf_counter() - started, 2)
                    write(report)
                    cuda = f", cuda {timing.cuda_ms:.3f} ms" if timing.cuda_ms is not None else ""
                    cuda += f", kernels {timing.kernel_ms:.3f} ms" if timing.kernel_ms is not None else ""
                    progress(
                        f"  {role} {mode} ctx {context} gamma {gamma} B={batch} {slots}: {timing.wall_ms:.3f} ms"
                        f"{cuda}, {timing.syncs} syncs, {timing.ops} ops ({report.elapsed_s:.0f} s)"
                    )
            for bench in benches.values():
                bench.close()
            del benches
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del loaded
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    report.complete = not report.skipped or all(" graphs: " in s for s in report.skipped)
    report.elapsed_s = round(time.perf_counter() - started, 2)
    write(report)
    return report


def write_report(path: Path | None) -> Callable[[StepReport], None]:
    """A ``write`` for :func:`run_step_bench` that rewrites ``path`` atomically (nothing when None)."""

    def write(report: StepReport) -> None:
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(path.suffix + ".partial")
        partial.write_text(json.dumps(report.to_dict(), indent=2))
        partial.replace(path)

    return write
