"""vLLM replicas with a StarSD draft against vLLM's own ways, in one run on one machine (issue: vLLM replicas
share a StarSD draft).

Five setups of vLLM's CPU build serving the same target checkpoint, each loaded by vLLM's own client
(`vllm bench serve`, random prompts, greedy, ``--ignore-eos``) at each concurrency:

* ``alone``: one replica, no speculation;
* ``draft-model``: one replica with vLLM's in-process draft model (``method: draft_model``);
* ``starsd``: one replica with StarSD's proposer and a StarSD draft (``method: custom_class``);
* ``pair-own``: two replicas, each with its own in-process draft (two drafts);
* ``pair-shared``: two replicas sharing one StarSD draft (one draft).

A pair is loaded by two clients at once, one per replica, each at the concurrency; its tokens/s is their sum.
All the servers start together and stay up for the whole run, so every setup is measured beside the same idle
processes. Acceptance is vLLM's own (its spec-decode counters, read by its client before and after a pass).

**Draft variants** (an interleaved A/B of ``starsd draft`` options): this machine's throughput drifts by 20% and
more between minutes, more than most changes to the draft are worth, so runs minutes apart compare poorly. With
``variants``, one replica of each kind (``draft-model``, ``starsd``) starts once; each round restarts the StarSD
draft with each variant in turn and measures the in-process draft right before each StarSD pass, so drift hits
both sides of every ratio alike; a variant's figure is its median ratio over the rounds.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import shlex
import signal
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starsd.bench.report import Column, Machine, table
from starsd.bench.vllm_fleet import (
    SERVED_NAME,
    VllmServer,
    draft_model_speculation,
    prometheus_totals,
    running,
    starsd_speculation,
    vllm_env,
)

if TYPE_CHECKING:
    from starsd.local import LocalStar

SETUPS = ("alone", "draft-model", "starsd", "pair-own", "pair-shared")
WARMUP_REQUESTS = 4  # one short pass per server before the measured ones
CLIENT_TIMEOUT = 1800.0  # seconds one client pass may take before the run is called failed


@dataclass(frozen=True)
class VllmCompareConfig:
    target: Path
    draft: Path
    venv: Path
    concurrency: tuple[int, ...]
    requests: int  # per client pass
    input_len: int
    output_len: int
    gamma: int  # num_speculative_tokens of every speculating setup
    start_seconds: float  # how long the servers may take to start, together
    log_dir: Path
    draft_args: tuple[str, ...] = ()  # more `starsd draft` options for the StarSD draft
    variants: tuple[str, ...] = ()  # `starsd draft` options to compare, interleaved (module docstring)
    rounds: int = 1  # with variants: how many times each is measured


@dataclass(frozen=True)
class ClientPass:
    """What one `vllm bench serve` pass against one replica reports."""

    completed: int
    failed: int
    output_tokens: int
    output_throughput: float  # tokens/s
    median_ttft_ms: float
    median_tpot_ms: float
    draft_tokens: int  # 0 without speculation
    accepted_tokens: int
    drafts: int  # verification steps that carried proposals

    @classmethod
    def from_client(cls, result: dict[str, Any]) -> ClientPass:
        """Read the client's ``--save-result`` JSON."""
        return cls(
            completed=int(result["completed"]),
            failed=int(result.get("failed", 0)),
            output_tokens=int(result["total_output_tokens"]),
            output_throughput=float(result["output_throughput"]),
            median_ttft_ms=float(result["median_ttft_ms"]),
            median_tpot_ms=float(result["median_tpot_ms"]),
            draft_tokens=int(result.get("spec_decode_draft_tokens", 0)),
            accepted_tokens=int(result.get("spec_decode_accepted_tokens", 0)),
            drafts=int(result.get("spec_decode_num_drafts", 0)),
        )


@dataclass(frozen=True)
class DraftSide:
    """The StarSD draft's share of a pass, from its ``/metrics`` read right before and right after it: at one
    client a round is about ``verify_ms + 2 * transfer_ms + service_ms`` (the system model's Tp + 2 Tc + Tq)."""

    requests: int  # proposal requests the draft answered during the pass
    service_ms: float | None  # the draft's compute per request (Tq)
    transfer_ms: float | None  # one way, from the proposers' round trips (Tc)
    verify_ms: float | None  # the replicas' time between a proposal and the next request (Tp)
    ahead_hits: float | None  # share of the requests answered from what the draft had drafted ahead


_TOTALS = ("starsd_draft_requests_total", "starsd_draft_ahead_hits_total")
_MEANS = ("starsd_draft_service_seconds", "starsd_draft_transfer_seconds", "starsd_draft_target_verify_seconds")


def draft_side(before: dict[str, float], after: dict[str, float]) -> DraftSide:
    """The draft's counters over a pass (``prometheus_totals`` of its ``/metrics`` before and after)."""
    names = [*_TOTALS, *(f"{m}_{part}" for m in _MEANS for part in ("sum", "count"))]
    d = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in names}

    def mean_ms(metric: str) -> float | None:
        count = d[f"{metric}_count"]
        return 1000.0 * d[f"{metric}_sum"] / count if count > 0 else None

    requests = int(d["starsd_draft_requests_total"])
    return DraftSide(
        requests=requests,
        service_ms=mean_ms("starsd_draft_service_seconds"),
        transfer_ms=mean_ms("starsd_draft_transfer_seconds"),
        verify_ms=mean_ms("starsd_draft_target_verify_seconds"),
        ahead_hits=d["starsd_draft_ahead_hits_total"] / requests if requests else None,
    )


@dataclass(frozen=True)
class VllmPoint:
    """One setup at one concurrency (per replica)."""

    setup: str
    concurrency: int
    replicas: int
    draft_models: int  # draft models loaded for the setup: 0, one per replica, or one shared
    output_throughput: float  # tokens/s over all replicas
    median_tpot_ms: float  # the slowest replica's
    failed: int
    acceptance: float | None  # accepted / drafted tokens, over the replicas
    acceptance_length: float | None  # tokens per verification step: 1 + accepted / steps with proposals
    variant: str | None = None  # with draft variants: the StarSD draft's options during this pass
    round: int | None = None  # with draft variants: which round
    draft: DraftSide | None = None  # setups with the StarSD draft: its share of the pass


def combine(setup: str, concurrency: int, passes: Sequence[ClientPass], draft_models: int) -> VllmPoint:
    """The replicas' passes of one setup as one point: tokens/s summed, acceptance over all drafted tokens."""
    drafted = sum(p.draft_tokens for p in passes)
    accepted = sum(p.accepted_tokens for p in passes)
    steps = sum(p.drafts for p in passes)
    return VllmPoint(
        setup=setup,
        concurrency=concurrency,
        replicas=len(passes),
        draft_models=draft_models,
        output_throughput=sum(p.output_throughput for p in passes),
        median_tpot_ms=max(p.median_tpot_ms for p in passes),
        failed=sum(p.failed for p in passes),
        acceptance=accepted / drafted if drafted else None,
        acceptance_length=1 + accepted / steps if steps else None,
    )


@dataclass(frozen=True)
class Ratio:
    name: str
    concurrency: int
    value: float | None  # None when a side is missing or measured nothing
    goal: float
    rounds: tuple[float, ...] = ()  # with draft variants: each round's ratio (``value`` is their median)


def ratios(points: Sequence[VllmPoint]) -> list[Ratio]:
    """The issue's two comparisons, per concurrency: the StarSD draft against vLLM's in-process draft (goal: at
    least 1 at one client), and two replicas sharing one draft against two with a draft each (goal: >= 0.9)."""
    by = {(p.setup, p.concurrency): p.output_throughput for p in points}
    out: list[Ratio] = []
    for c in sorted({p.concurrency for p in points}):
        for name, (num, den), goal in (
            ("starsd / draft-model", ("starsd", "draft-model"), 1.0),
            ("pair-shared / pair-own", ("pair-shared", "pair-own"), 0.9),
            ("starsd / alone", ("starsd", "alone"), 1.0),
        ):
            a, b = by.get((num, c)), by.get((den, c))
            out.append(Ratio(name, c, a / b if a is not None and b else None, goal))
    return out


def variant_ratios(points: Sequence[VllmPoint]) -> list[Ratio]:
    """Per draft variant and concurrency: the StarSD pass against the in-process pass measured just before it,
    each round, and the median of those ratios over the rounds (goal: at least 1)."""
    by = {(p.setup, p.variant, p.round, p.concurrency): p.output_throughput for p in points}
    out: list[Ratio] = []
    for c in sorted({p.concurrency for p in points}):
        for variant in dict.fromkeys(p.variant for p in points if p.variant is not None):
            each = []
            for r in sorted({p.round for p in points if p.variant == variant and p.round is not None}):
                a, b = by.get(("starsd", variant, r, c)), by.get(("draft-model", variant, r, c))
                if a is not None and b:
                    each.append(a / b)
            median = statistics.median(each) if each else None
            out.append(Ratio(f"starsd / draft-model [{variant}]", c, median, 1.0, tuple(each)))
    return out


@dataclass
class VllmCompareReport:
    """``starsd bench vllm``'s report."""

    benchmark: str = field(default="vllm", init=False)
    config: VllmCompareConfig
    machine: Machine
    points: list[VllmPoint]
    ratios: list[Ratio] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.ratios:
            self.ratios = variant_ratios(self.points) if self.config.variants else ratios(self.points)

    def table(self) -> str:
        columns: list[Column[VllmPoint]] = [
            Column("setup", lambda p: p.setup, "", 12, left=True),
            Column("C", lambda p: p.concurrency, "d", 4),
            Column("replicas", lambda p: p.replicas, "d", 9),
            Column("drafts", lambda p: p.draft_models, "d", 7),
            Column("tok/s", lambda p: p.output_throughput, ".1f", 9),
            Column("TPOT p50", lambda p: p.median_tpot_ms, ".1f", 10, unit=" ms"),
            Column("accept", lambda p: p.acceptance, ".3f", 8),
            Column("acc len", lambda p: p.acceptance_length, ".2f", 8),
            Column("failed", lambda p: p.failed, "d", 7),
        ]
        if any(p.draft is not None for p in self.points):
            columns += [
                Column("Tq", lambda p: p.draft and p.draft.service_ms, ".2f", 8),
                Column("Tc", lambda p: p.draft and p.draft.transfer_ms, ".2f", 7),
                Column("Tp", lambda p: p.draft and p.draft.verify_ms, ".2f", 8),
                Column("ahead", lambda p: p.draft and p.draft.ahead_hits, ".2f", 6),
            ]
        if self.config.variants:
            columns[2:4] = [
                Column("round", lambda p: p.round, "d", 6),
                Column("draft options", lambda p: p.variant, "", 24, left=True),
            ]
        lines = table(self.points, columns, sep=" ")
        lines += ["", "ratio                       C    tokens/s ratio  goal"]
        for r in self.ratios:
            value = "-" if r.value is None else f"{r.value:.2f}x"
            each = f"  (median of {', '.join(f'{x:.2f}' for x in r.rounds)})" if len(r.rounds) > 1 else ""
            lines.append(f"{r.name:<26}{r.concurrency:>3}{value:>16}  >= {r.goal:g}x{each}")
        if any(p.draft is not None for p in self.points):
            lines.append(
                "Tq, Tc, Tp: the StarSD draft's compute per request, the one-way transfer and the replicas' step "
                "between proposals (ms, from its /metrics over the pass); ahead: share of requests drafted ahead"
            )
        lines.append(self.machine.describe())
        return "\n".join(lines)


def client_argv(config: VllmCompareConfig, server: VllmServer, concurrency: int, result: Path) -> list[str]:
    """`vllm bench serve` as the project's peer figures run it (../docs/vllm.md), saving its JSON to ``result``."""
    return [
        str(config.venv / "bin" / "vllm"),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        server.url,
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(config.target),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(config.input_len),
        "--random-output-len",
        str(config.output_len),
        "--num-prompts",
        str(config.requests),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


def run_client(config: VllmCompareConfig, server: VllmServer, concurrency: int, tag: str) -> ClientPass:
    result = config.log_dir / f"{tag}.json"
    log = config.log_dir / f"{tag}.log"
    with log.open("wb") as out:
        proc = subprocess.run(
            client_argv(config, server, concurrency, result),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=vllm_env(config.venv, {}),
            timeout=CLIENT_TIMEOUT,
            check=False,
        )
    if proc.returncode != 0 or not result.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"vllm bench serve against {server.name} failed (exit {proc.returncode}):\n{tail}")
    return ClientPass.from_client(json.loads(result.read_text()))


def measure(config: VllmCompareConfig, setups: Sequence[str], progress: Callable[[str], None]) -> list[VllmPoint]:
    """Start one StarSD draft and the replicas the setups need, then load each setup at each concurrency (with
    ``config.variants``: the interleaved draft variants instead, see :func:`measure_variants`)."""
    from starsd.local import LocalStar

    if config.variants:
        return measure_variants(config, progress)

    star = LocalStar(
        draft_model=config.draft, targets=0, log_dir=config.log_dir / "draft", draft_args=list(config.draft_args)
    )
    progress(f"starting a StarSD draft on {config.draft}")
    star.start()
    try:
        own = draft_model_speculation(config.draft, config.gamma)
        wanted = set(setups)
        servers: dict[str, VllmServer] = {}
        if "alone" in wanted:
            servers["alone"] = _replica(config, "alone", None)
        if wanted & {"draft-model", "pair-own"}:
            servers["own-1"] = _replica(config, "own-1", own)
        if "pair-own" in wanted:
            servers["own-2"] = _replica(config, "own-2", own)
        if wanted & {"starsd", "pair-shared"}:
            servers["shared-1"] = _starsd_replica(config, "shared-1", star.draft_address)
        if "pair-shared" in wanted:
            servers["shared-2"] = _starsd_replica(config, "shared-2", star.draft_address)
        members = {
            "alone": (["alone"], 0),
            "draft-model": (["own-1"], 1),
            "starsd": (["shared-1"], 1),
            "pair-own": (["own-1", "own-2"], 2),
            "pair-shared": (["shared-1", "shared-2"], 1),
        }
        progress(f"starting {len(servers)} vLLM servers together ({', '.join(servers)}); 2-3 minutes each on 2 cores")
        points: list[VllmPoint] = []
        with running(*servers.values(), start_seconds=config.start_seconds):
            warmup = dataclasses.replace(config, requests=WARMUP_REQUESTS)
            for name, server in servers.items():  # first requests pay for lazy start-up work; not measured
                progress(f"warming up {name}")
                run_client(warmup, server, 1, f"warmup-{name}")
            for c in config.concurrency:
                for setup in [s for s in SETUPS if s in wanted]:
                    names, drafts = members[setup]
                    tags = [f"{setup}-c{c}-{n}" for n in names]
                    uses_draft = setup in ("starsd", "pair-shared")
                    before = draft_totals(star) if uses_draft else {}
                    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
                        passes = list(
                            pool.map(
                                run_client, [config] * len(names), [servers[n] for n in names], [c] * len(names), tags
                            )
                        )
                    point = combine(setup, c, passes, drafts)
                    if uses_draft:
                        point = dataclasses.replace(point, draft=draft_side(before, draft_totals(star)))
                    points.append(point)
                    progress(f"{setup} at C={c}: {point.output_throughput:.1f} tok/s, {point.failed} failed")
        return points
    finally:
        star.stop()


def _replica(
    config: VllmCompareConfig, name: str, speculative: dict[str, Any] | None, env: dict[str, str] | None = None
) -> VllmServer:
    """A `vllm serve` of the target, logging to ``<log_dir>/<name>.log``."""
    return VllmServer(name, config.target, config.log_dir / f"{name}.log", dict(env or {}), speculative, config.venv)


def _starsd_replica(config: VllmCompareConfig, name: str, draft_address: str) -> VllmServer:
    """A replica whose proposer asks the StarSD draft at ``draft_address``, as target ``name``."""
    env = {"STARSD_DRAFT": draft_address, "STARSD_TARGET_ID": name}
    return _replica(config, name, starsd_speculation(config.gamma), env)


LINK_SECONDS = 120.0  # how long a restarted draft may wait for the replica's proposer to reconnect


def measure_variants(config: VllmCompareConfig, progress: Callable[[str], None]) -> list[VllmPoint]:
    """The interleaved A/B (module docstring): one ``draft-model`` and one ``starsd`` replica, started once; per
    round and variant, the StarSD draft restarted with the variant's options, then at each concurrency the
    in-process draft's pass and the StarSD draft's pass, back to back."""
    from starsd.local import LocalStar

    def options(variant: str) -> list[str]:
        return [*config.draft_args, *shlex.split(variant)]

    star = LocalStar(
        draft_model=config.draft, targets=0, log_dir=config.log_dir / "draft", draft_args=options(config.variants[0])
    )
    progress(f"starting a StarSD draft on {config.draft}")
    star.start()
    try:
        own = _replica(config, "own-1", draft_model_speculation(config.draft, config.gamma))
        shared = _starsd_replica(config, "shared-1", star.draft_address)
        progress("starting 2 vLLM servers together (own-1, shared-1); 2-3 minutes each on 2 cores")
        points: list[VllmPoint] = []
        warmup = dataclasses.replace(config, requests=WARMUP_REQUESTS)
        with running(own, shared, start_seconds=config.start_seconds):
            run_client(warmup, own, 1, "warmup-own-1")
            for r in range(config.rounds):
                for i, variant in enumerate(config.variants):
                    progress(f"round {r + 1} of {config.rounds}: the StarSD draft with {variant!r}")
                    star.kill_draft(sig=signal.SIGTERM)  # drains in a moment; killed if it does not
                    if star.draft is not None and star.draft.alive():
                        star.kill_draft()
                    star.draft_args = options(variant)
                    star.restart_draft()
                    run_client(warmup, shared, 1, f"warmup-shared-1-r{r}-v{i}")  # meanwhile its proposer reconnects
                    _wait_for_targets(f"http://{star.host}:{star.metrics_port}/metrics", 1, LINK_SECONDS)
                    for c in config.concurrency:
                        for setup, server in (("draft-model", own), ("starsd", shared)):
                            tag = f"{setup}-c{c}-r{r}-v{i}"
                            before = draft_totals(star) if server is shared else {}
                            point = combine(setup, c, [run_client(config, server, c, tag)], 1)
                            side = draft_side(before, draft_totals(star)) if server is shared else None
                            points.append(dataclasses.replace(point, variant=variant, round=r, draft=side))
                            progress(f"{setup} at C={c}: {point.output_throughput:.1f} tok/s, {point.failed} failed")
        return points
    finally:
        star.stop()


def draft_totals(star: LocalStar) -> dict[str, float]:
    """The StarSD draft's ``/metrics`` as totals (``prometheus_totals``)."""
    with urllib.request.urlopen(f"http://{star.host}:{star.metrics_port}/metrics", timeout=10) as reply:
        return prometheus_totals(reply.read().decode())


def _wait_for_targets(metrics_url: str, targets: int, seconds: float) -> None:
    """Wait until the draft at ``metrics_url`` has ``targets`` connected (a restarted draft: the replicas'
    proposers reconnect in the background), or fail the run."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(metrics_url, timeout=5) as reply:
                connected = prometheus_totals(reply.read().decode()).get("starsd_draft_connected_targets", 0.0)
        except OSError:
            connected = 0.0
        if connected >= targets:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the restarted StarSD draft saw {connected:.0f} of {targets} replicas in {seconds:.0f} s"
            )
        time.sleep(0.2)
