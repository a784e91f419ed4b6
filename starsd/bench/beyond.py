"""Issue 9's benchmarks: batched drafting (capacity), fair scheduling (fairness), adaptive gamma (gamma).

Each measures the new behaviour against the plain one in the same run, against a real ``starsd draft``
process on loopback, with emulated targets (real gRPC clients) in this process.

* capacity: requests/s at saturation of the real draft checkpoint, ``--max-batch 1`` against ``--max-batch B``.
  Saturation: many sessions, zero verify time, each re-requesting as soon as it is answered.
* fairness: skewed demand (one target with many sessions, a few with one each) on an emulated draft, in the
  fully-loaded regime, ``--schedule fifo`` against ``fair``: per-target throughput and Jain's index of it.
* gamma: per profile, fixed gamma against adaptive gamma (``starsd.adaptive.choose_gamma`` per session per
  round, fed with what the target measures), on an emulated draft that charges time per drafted token.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from starsd.adaptive import AcceptanceEstimate, choose_gamma, ewma
from starsd.bench.draft_process import DraftProcess, process_cpu_seconds
from starsd.bench.targets import (
    EmulatedTarget,
    TargetRun,
    TargetSpec,
    end_stream,
    exchange,
    fetch_vocab_size,
    open_channel,
)
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc

_session_ids = itertools.count(1_000_000)


# --- pure parts --------------------------------------------------------------------------------------------


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all equal, 1/n when one takes all."""
    if not values:
        raise ValueError("Jain's index needs at least one value")
    if any(v < 0 for v in values):
        raise ValueError("Jain's index is for non-negative values")
    squares = sum(v * v for v in values)
    if squares == 0.0:
        return 1.0  # nobody got anything: equally
    return sum(values) ** 2 / (len(values) * squares)


def window_counts(runs: Sequence[TargetRun], start: float, end: float) -> tuple[int, int]:
    """(rounds, committed tokens) of ``runs`` whose round was committed inside ``[start, end)``."""
    rounds = tokens = 0
    for run in runs:
        for r in run.rounds:
            if start <= r.committed < end:
                rounds += 1
                tokens += r.tokens
    return rounds, tokens


def per_target_throughput(runs: Sequence[TargetRun], start: float, end: float) -> dict[str, float]:
    """Committed tokens/s per target id (several runs may share one id: one per session)."""
    if end <= start:
        raise ValueError("the window must have a positive length")
    out: dict[str, float] = {}
    for run in runs:
        _, tokens = window_counts([run], start, end)
        out[run.target_id] = out.get(run.target_id, 0.0) + tokens / (end - start)
    return out


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


# --- running targets against a draft ------------------------------------------------------------------------


async def _run_window(
    address: str,
    make: Callable[[grpc.aio.Channel, int], Any],
    count: int,
    warmup: float,
    duration: float,
    probe: Callable[[], Awaitable[dict[str, float]]] | None = None,
) -> tuple[list[TargetRun], float, float]:
    """Start ``count`` targets (``make(channel, i)``), measure ``[warmup, warmup + duration)``, stop them.

    ``probe`` (optional) is awaited at both ends of the window; its readings are left in ``last_probe``.
    """
    stop = asyncio.Event()
    channels = [open_channel(address) for _ in range(count)]
    try:
        targets = [make(ch, i) for i, ch in enumerate(channels)]
        tasks = [asyncio.create_task(t.run(stop)) for t in targets]
        begun = time.perf_counter()
        await asyncio.sleep(warmup)
        before = await probe() if probe else {}
        await asyncio.sleep(max(0.0, begun + warmup + duration - time.perf_counter()))
        after = await probe() if probe else {}
        last_probe.clear()
        last_probe.update({k: after[k] - before[k] for k in after if k in before})
        stop.set()
        runs: list[TargetRun] = list(await asyncio.gather(*tasks))
    finally:
        for ch in channels:
            await ch.close()
    errors = [r.error for r in runs if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} targets failed, e.g. {errors[0]}")
    return runs, begun + warmup, begun + warmup + duration


last_probe: dict[str, float] = {}  # the probe's differences over the last window


async def _with_draft(extra: list[str], body: Callable[[str, int], Any]) -> Any:
    proc = DraftProcess(extra)
    endpoint = await proc.start()
    try:
        vocab = await fetch_vocab_size(endpoint.address)
        return await body(endpoint.address, vocab)
    finally:
        proc.stop()


def parse_metrics(text: str, names: Sequence[str]) -> dict[str, float]:
    """The values of the named samples in Prometheus text (``name value`` lines, no labels)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in wanted:
            out[parts[0]] = float(parts[1])
    return out


DRAFT_SAMPLES = (
    "starsd_draft_batch_size_sum",
    "starsd_draft_batch_size_count",
    "starsd_draft_busy_seconds_total",
)


def draft_probe(metrics_url: str, pid: int | None) -> Callable[[], Awaitable[dict[str, float]]]:
    """Reads the draft's batch and busy counters from /metrics, its CPU seconds from /proc, and the clock."""
    import aiohttp

    async def probe() -> dict[str, float]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(metrics_url, timeout=aiohttp.ClientTimeout(total=5)) as resp,
        ):
            values = parse_metrics(await resp.text(), DRAFT_SAMPLES)
        cpu = process_cpu_seconds(pid) if pid else None
        if cpu is not None:
            values["cpu_seconds"] = cpu
        values["wall_seconds"] = time.perf_counter()
        return values

    return probe


# --- 1. capacity ---------------------------------------------------------------------------------------------


@dataclass
class CapacityPoint:
    max_batch: int
    sessions: int
    gamma: int
    rounds: int
    duration: float
    requests_per_s: float
    tokens_per_s: float
    service_p50_ms: float  # the draft's reported time per request (its batch's time / batch size)
    mean_batch: float | None = None  # requests per drafting step in the window, from /metrics
    draft_busy: float | None = None  # fraction of the window the draft's compute thread was computing
    draft_cpu: float | None = None  # CPU cores the draft used (its server and model processes)
    speedup: float | None = None  # against the first (smallest) batch in the same repeat
    repeat: int = 0  # which pass over the batch sizes (they are interleaved: 1, 8, 1, 8, ...)


@dataclass
class CapacitySummary:
    max_batch: int
    requests_per_s: float  # median over the repeats
    requests_per_s_min: float
    requests_per_s_max: float
    speedup: float | None  # median requests/s over the first batch size's median
    speedups: list[float | None]  # per repeat, against the first batch size in that repeat


async def _capacity_window(
    address: str,
    vocab: int,
    probe: Callable[[], Awaitable[dict[str, float]]],
    batch: int,
    sessions: int,
    gamma: int,
    warmup: float,
    duration: float,
    session_tokens: int,
) -> CapacityPoint:
    spec = TargetSpec(
        gamma=gamma,
        betas=(0.7,) * gamma,
        verify_seconds=0.0,
        wire_seconds=0.0,
        vocab_size=vocab,
        session_tokens=session_tokens,
    )
    runs, t0, t1 = await _run_window(
        address, lambda ch, i: EmulatedTarget(f"t{i}", ch, spec, seed=i), sessions, warmup, duration, probe
    )
    d = dict(last_probe)
    wall = d.get("wall_seconds", 0.0)
    rounds, tokens = window_counts(runs, t0, t1)
    services = [r.service for run in runs for r in run.rounds if t0 <= r.committed < t1]
    return CapacityPoint(
        batch,
        sessions,
        gamma,
        rounds,
        t1 - t0,
        rounds / (t1 - t0),
        tokens / (t1 - t0),
        statistics.median(services) * 1e3 if services else 0.0,
        ratio(d.get("starsd_draft_batch_size_sum", 0.0), d.get("starsd_draft_batch_size_count", 0.0)),
        ratio(d.get("starsd_draft_busy_seconds_total", 0.0), wall),
        ratio(d["cpu_seconds"], wall) if "cpu_seconds" in d else None,
    )


async def measure_capacity(
    draft_model: str,
    batches: Sequence[int],
    sessions: int,
    gamma: int,
    warmup: float,
    duration: float,
    session_tokens: int = 512,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[CapacityPoint]:
    """One draft per batch size, all started first; then ``repeats`` interleaved passes over them.

    Interleaving (1, 8, 1, 8, ...) puts every batch size under the same slow drifts of a shared machine, and
    each pass gives its own speedup; the summary takes medians.
    """
    procs = {
        b: DraftProcess(["--model", draft_model, "--max-batch", str(b), "--max-sessions", str(4 * sessions + 64)])
        for b in dict.fromkeys(batches)
    }
    points: list[CapacityPoint] = []
    try:
        endpoints = {b: await proc.start() for b, proc in procs.items()}
        vocab = await fetch_vocab_size(endpoints[batches[0]].address)
        for repeat in range(repeats):
            first: CapacityPoint | None = None
            for b, proc in procs.items():
                url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
                probe = draft_probe(url, endpoints[b].pid)
                point = await _capacity_window(
                    endpoints[b].address, vocab, probe, b, sessions, gamma, warmup, duration, session_tokens
                )
                point.repeat = repeat
                first = first or point
                point.speedup = ratio(point.requests_per_s, first.requests_per_s)
                points.append(point)
                if progress:
                    progress(f"  pass {repeat + 1}/{repeats} max-batch {b}: {point.requests_per_s:.1f} requests/s")
    finally:
        for proc in procs.values():
            proc.stop()
    return points


def summarise_capacity(points: Sequence[CapacityPoint]) -> list[CapacitySummary]:
    batches = list(dict.fromkeys(p.max_batch for p in points))
    medians = {b: statistics.median(p.requests_per_s for p in points if p.max_batch == b) for b in batches}
    out = []
    for b in batches:
        mine = [p for p in points if p.max_batch == b]
        out.append(
            CapacitySummary(
                b,
                medians[b],
                min(p.requests_per_s for p in mine),
                max(p.requests_per_s for p in mine),
                ratio(medians[b], medians[batches[0]]),
                [p.speedup for p in mine],
            )
        )
    return out


def format_capacity(points: Sequence[CapacityPoint]) -> str:
    def opt(v: float | None, spec: str) -> str:
        return format(v, spec) if v is not None else "-"

    lines = [
        f"{'pass':>4}{'max-batch':>10}{'sessions':>9}{'gamma':>6}{'requests/s':>12}{'tokens/s':>10}{'ms/req':>8}"
        f"{'batch':>7}{'busy':>6}{'cpu':>6}{'x first':>9}"
    ]
    for p in points:
        lines.append(
            f"{p.repeat + 1:>4}{p.max_batch:>10}{p.sessions:>9}{p.gamma:>6}{p.requests_per_s:>12.1f}"
            f"{p.tokens_per_s:>10.1f}{p.service_p50_ms:>8.2f}{opt(p.mean_batch, '.2f'):>7}"
            f"{opt(p.draft_busy, '.2f'):>6}{opt(p.draft_cpu, '.2f'):>6}{opt(p.speedup, '.2f'):>9}"
        )
    lines.append(
        "(ms/req: the draft's median compute per request; batch: mean requests per step; busy: compute-thread "
        "busy fraction; cpu: cores the draft used, server and model process; x first: against the first batch "
        "size in the same pass)"
    )
    for s in summarise_capacity(points):
        lines.append(
            f"max-batch {s.max_batch}: median {s.requests_per_s:.1f} requests/s "
            f"(range {s.requests_per_s_min:.1f}-{s.requests_per_s_max:.1f}), x{opt(s.speedup, '.2f')} the first"
        )
    return "\n".join(lines)


# --- 2. fairness ---------------------------------------------------------------------------------------------


@dataclass
class FairnessPoint:
    schedule: str
    per_target: dict[str, float]  # committed tokens/s
    total: float
    jain: float


def skewed_targets(busy_sessions: int, small_targets: int) -> list[str]:
    """The target id of each session: ``busy`` ``busy_sessions`` times, then ``small-1..small_targets``."""
    return ["busy"] * busy_sessions + [f"small-{i + 1}" for i in range(small_targets)]


def fairness_point(schedule: str, per_target: dict[str, float]) -> FairnessPoint:
    values = list(per_target.values())
    return FairnessPoint(schedule, dict(per_target), sum(values), jain_index(values))


async def measure_fairness(
    schedules: Sequence[str],
    busy_sessions: int,
    small_targets: int,
    tq: float,
    tp: float,
    gamma: int,
    alpha: float,
    warmup: float,
    duration: float,
) -> list[FairnessPoint]:
    ids = skewed_targets(busy_sessions, small_targets)
    points: list[FairnessPoint] = []
    for schedule in schedules:
        extra = ["--emulate-service-time", repr(tq), "--schedule", schedule, "--max-sessions", "256"]

        async def body(address: str, vocab: int, schedule: str = schedule) -> FairnessPoint:
            spec = TargetSpec(
                gamma=gamma, betas=(alpha,) * gamma, verify_seconds=tp, wire_seconds=0.0, vocab_size=vocab
            )
            runs, t0, t1 = await _run_window(
                address, lambda ch, i: EmulatedTarget(ids[i], ch, spec, seed=i), len(ids), warmup, duration
            )
            return fairness_point(schedule, per_target_throughput(runs, t0, t1))

        points.append(await _with_draft(extra, body))
    return points


def format_fairness(points: Sequence[FairnessPoint]) -> str:
    ids = list(points[0].per_target) if points else []
    lines = [f"{'schedule':<9}" + "".join(f"{i:>10}" for i in ids) + f"{'total':>10}{'Jain':>7}"]
    for p in points:
        lines.append(
            f"{p.schedule:<9}"
            + "".join(f"{p.per_target.get(i, 0.0):>10.1f}" for i in ids)
            + f"{p.total:>10.1f}{p.jain:>7.3f}"
        )
    lines.append("(committed tokens/s per target; Jain's index over targets, not sessions)")
    return "\n".join(lines)


# --- 3. adaptive gamma -----------------------------------------------------------------------------------------


GammaPolicy = int | str  # a fixed gamma, or "adaptive"


@dataclass
class GammaRecord:
    run: TargetRun
    gammas: list[int] = field(default_factory=list)


class RoundDraws:
    """Which drafted tokens a target accepts, drawn per round index (common random numbers).

    Round ``r`` of a target has its own ``width`` uniforms, the same under every policy: position ``j`` of
    that round is accepted while ``u[r][j] < alpha``. A longer gamma accepts the same run as a shorter one,
    plus what its extra positions add, so policies differ by their choices and not by the luck of the draws.
    """

    def __init__(self, alpha: float, seed: int, width: int) -> None:
        self.alpha, self.width = alpha, width
        self._rng = random.Random(seed)
        self._rounds: list[list[float]] = []

    def accepted(self, round_index: int, gamma: int) -> int:
        if gamma > self.width:
            raise ValueError(f"gamma {gamma} exceeds the {self.width} draws per round")
        while len(self._rounds) <= round_index:
            self._rounds.append([self._rng.random() for _ in range(self.width)])
        draws = self._rounds[round_index]
        run = 0
        while run < gamma and draws[run] < self.alpha:
            run += 1
        return run


class GammaTarget:
    """An emulated target whose gamma is fixed or chosen per round with ``choose_gamma``.

    Acceptance follows :class:`RoundDraws` with the profile's constant alpha. The adaptive choice sees
    only what a real target measures: its acceptance, the draft's ``service_seconds`` per proposed token
    and ``draft_sessions``, its own verify time, and the transfer time (its mean round trip less the draft's
    queueing and compute, halved, as ``starsd target`` measures it).
    """

    def __init__(
        self,
        target_id: str,
        channel: grpc.aio.Channel,
        policy: GammaPolicy,
        alpha: float,
        tp: float,
        tc: float,
        vocab_size: int,
        seed: int,
        max_gamma: int = 8,
        session_tokens: int = 512,
        first_gamma: int = 4,
    ) -> None:
        self.first_gamma = min(first_gamma, max_gamma)
        self.stub = pb_grpc.DraftStub(channel)
        self.policy, self.alpha, self.tp, self.tc = policy, alpha, tp, tc
        self.vocab_size, self.max_gamma, self.session_tokens = vocab_size, max_gamma, session_tokens
        self.rng = random.Random(seed)
        self.draws = RoundDraws(alpha, seed, max(max_gamma, first_gamma))
        self.record = GammaRecord(TargetRun(target_id))

    def _gamma(self, est: AcceptanceEstimate, token_time: float, tp: float, tc: float, sessions: int) -> int:
        if isinstance(self.policy, int):
            return self.policy
        if token_time <= 0.0:  # nothing measured yet: the plain gamma for the first round
            return self.first_gamma
        return choose_gamma(est.alpha, token_time, tp, tc, sessions, self.max_gamma)

    async def run(self, stop: asyncio.Event) -> TargetRun:
        from starsd.bench.targets import Round

        record = self.record.run
        call = self.stub.Propose()
        session, seq, committed = next(_session_ids), 1, 0
        tokens = [self.rng.randrange(self.vocab_size) for _ in range(16)]
        est = AcceptanceEstimate()
        token_time, tp_seen, sessions = 0.0, self.tp, 1
        transfer = float("nan")  # one way, loopback and protocol overhead included (mean, queueing excluded)
        try:
            while not stop.is_set():
                tc_seen = self.tc + (0.0 if math.isnan(transfer) else transfer)
                gamma = self._gamma(est, token_time, tp_seen, tc_seen, sessions)
                self.record.gammas.append(gamma)
                if seq == 1:
                    record.sessions += 1
                sent = time.perf_counter()
                request = pb.ProposeRequest(
                    target_id=record.target_id, session_id=session, seq=seq, tokens=tokens, gamma=gamma
                )
                response = await exchange(call, request, 30.0)
                received = time.perf_counter()
                proposed = list(response.token_ids)
                service = float(response.service_seconds)
                accepted = self.draws.accepted(len(record.rounds), len(proposed))
                queued = float(response.queue_seconds)
                transfer = ewma(transfer, max(0.0, (received - sent - service - queued) / 2))
                before = time.perf_counter()
                await asyncio.sleep(self.tp + 2 * self.tc)
                committed_at = time.perf_counter()
                record.rounds.append(Round(sent, received, committed_at, accepted + 1, accepted, service))
                # What this target measured, for the next choice.
                est.update(accepted, len(proposed))
                if proposed:
                    token_time = service / len(proposed)
                sessions = max(1, int(response.draft_sessions))
                tp_seen = max(0.0, committed_at - before - 2 * self.tc)
                tokens = [*proposed[:accepted], self.rng.randrange(self.vocab_size)]
                committed += accepted + 1
                seq += 1
                if committed >= self.session_tokens:
                    await call.write(
                        pb.ProposeRequest(target_id=record.target_id, session_id=session, seq=seq, release=True)
                    )
                    session, seq, committed = next(_session_ids), 1, 0
            await end_stream(call, record.target_id, session, seq, 30.0)
        except (grpc.aio.AioRpcError, RuntimeError, TimeoutError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            call.cancel()
        return record


@dataclass
class GammaPoint:
    profile: str
    n: int
    policy: str  # "1".."8" or "adaptive"
    tokens_per_s: float
    mean_gamma: float


@dataclass
class GammaSummary:
    profile: str
    n: int
    best_fixed: str
    best_fixed_tokens_per_s: float
    gamma4_tokens_per_s: float | None
    adaptive_tokens_per_s: float
    adaptive_vs_best: float | None  # adaptive / best fixed
    adaptive_vs_gamma4: float | None


def summarise_gamma(points: Sequence[GammaPoint]) -> list[GammaSummary]:
    """Per (profile, N): the best fixed gamma, gamma=4 and adaptive, with their ratios."""
    out: list[GammaSummary] = []
    keys = list(dict.fromkeys((p.profile, p.n) for p in points))
    for profile, n in keys:
        group = [p for p in points if p.profile == profile and p.n == n]
        fixed = [p for p in group if p.policy != "adaptive"]
        adaptive = [p for p in group if p.policy == "adaptive"]
        if not fixed or not adaptive:
            continue
        best = max(fixed, key=lambda p: p.tokens_per_s)
        g4 = next((p.tokens_per_s for p in fixed if p.policy == "4"), None)
        a = adaptive[0].tokens_per_s
        out.append(
            GammaSummary(
                profile,
                n,
                best.policy,
                best.tokens_per_s,
                g4,
                a,
                ratio(a, best.tokens_per_s),
                ratio(a, g4) if g4 is not None else None,
            )
        )
    return out


async def measure_gamma(
    profile_names: Sequence[str],
    gammas: Sequence[int],
    n_multipliers: Sequence[int],
    warmup: float,
    duration: float,
    max_gamma: int = 8,
    progress: Callable[[str], None] | None = None,
) -> list[GammaPoint]:
    from starsd import model
    from starsd.bench import profiles

    points: list[GammaPoint] = []
    for name in profile_names:
        prof = profiles.get(name)
        token_time = prof.tq / prof.gamma  # Tq is gamma sequential draft steps
        n_star = max(1, round(model.optimal_targets(prof.tq, prof.tp, prof.tc)))
        extra = [
            "--emulate-service-time",
            "0",
            "--emulate-token-time",
            repr(token_time),
            "--max-gamma",
            str(max(16, max_gamma)),
            "--max-sessions",
            "1024",
        ]

        async def body(address: str, vocab: int, prof: profiles.Profile = prof, n_star: int = n_star) -> None:
            policies: list[GammaPolicy] = [*gammas, "adaptive"]
            for mult in n_multipliers:
                n = n_star * mult
                for policy in policies:
                    made: list[GammaTarget] = []

                    def make(
                        ch: grpc.aio.Channel, i: int, policy: GammaPolicy = policy, made: list[GammaTarget] = made
                    ) -> GammaTarget:
                        t = GammaTarget(
                            f"t{i}",
                            ch,
                            policy,
                            prof.alpha,
                            prof.tp,
                            prof.tc,
                            vocab,
                            i,
                            max_gamma,
                            first_gamma=prof.gamma,
                        )
                        made.append(t)
                        return t

                    runs, t0, t1 = await _run_window(address, make, n, warmup, duration)
                    _, tokens = window_counts(runs, t0, t1)
                    used = [g for t in made for g in t.record.gammas]
                    point = GammaPoint(
                        prof.name, n, str(policy), tokens / (t1 - t0), statistics.fmean(used) if used else 0.0
                    )
                    points.append(point)
                    if progress:
                        progress(f"  {prof.name} N={n} gamma={policy}: {point.tokens_per_s:.1f} tokens/s")

        await _with_draft(extra, body)
    return points


def format_gamma(points: Sequence[GammaPoint]) -> str:
    policies = list(dict.fromkeys(p.policy for p in points))
    lines = [f"{'profile':<36}{'N':>4}" + "".join(f"{'g=' + q if q != 'adaptive' else 'adapt':>8}" for q in policies)]
    lines[0] += f"{'mean g':>8}{'a/best':>8}{'a/g4':>7}"
    summaries = {(s.profile, s.n): s for s in summarise_gamma(points)}
    for key in dict.fromkeys((p.profile, p.n) for p in points):
        row = {p.policy: p for p in points if (p.profile, p.n) == key}
        line = f"{key[0]:<36}{key[1]:>4}" + "".join(
            f"{row[q].tokens_per_s:>8.1f}" if q in row else f"{'-':>8}" for q in policies
        )
        s = summaries.get(key)
        mean_g = row["adaptive"].mean_gamma if "adaptive" in row else 0.0
        vb = f"{s.adaptive_vs_best:.3f}" if s and s.adaptive_vs_best is not None else "-"
        v4 = f"{s.adaptive_vs_gamma4:.3f}" if s and s.adaptive_vs_gamma4 is not None else "-"
        lines.append(line + f"{mean_g:>8.2f}{vb:>8}{v4:>7}")
    lines.append("(committed tokens/s, all targets together; mean g: adaptive's mean gamma)")
    return "\n".join(lines)


def to_jsonable(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [asdict(i) for i in items]
