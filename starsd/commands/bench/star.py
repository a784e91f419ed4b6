"""``starsd bench star``: N emulated targets on the real draft server, swept over N, against the system model
(:mod:`starsd.bench.star`); with ``--drafts``, D drafts and D x N* targets (:mod:`starsd.bench.drafts`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from starsd import system_model
from starsd.commands._common import add_profile_args, target_counts
from starsd.commands.bench.common import error, publish

if TYPE_CHECKING:  # the benchmark's modules import grpc and aiohttp: only when a benchmark runs
    from starsd.bench.star import StarConfig, StarReport


HELP = "N emulated targets on the real draft server, swept over N, against the system model"
DESCRIPTION = (
    "Starts the real draft server (emulating a draft accelerator's service time, or a real checkpoint "
    "with --draft-model) and N emulated targets in this process: the target's own engine and draft link "
    "with a model step whose verify time and acceptance follow an accelerator profile. Sweeps N and "
    "reports throughput, draft "
    "utilisation and idle gaps, per-target latency and measured/model throughput, with the "
    "target-only and N-independent-pairs baselines."
)


def configure(parser: argparse.ArgumentParser) -> None:
    from starsd.bench.profiles import DEFAULT_PROFILE  # no grpc, no aiohttp: cheap

    src = parser.add_argument_group("profile (flags override its values)")
    add_profile_args(src, DEFAULT_PROFILE, tc="one-way transfer time added by the emulated targets")
    src.add_argument("--alpha", type=float, help="per-position acceptance probability")
    drf = parser.add_argument_group("the draft")
    drf.add_argument(
        "--draft-service-time",
        type=float,
        metavar="SECONDS",
        help="emulated draft service time per request (default: the profile's Tq)",
    )
    drf.add_argument("--draft-model", type=Path, metavar="PATH", help="run a real draft checkpoint instead")
    drf.add_argument("--max-batch", type=int, default=1, help="requests the draft may batch per step")
    drf.add_argument("--batch-curve", help='emulated Tq(B), e.g. "1:0.004,8:0.006" (default: the profile\'s)')
    drf.add_argument("--vocab-size", type=int, default=32000, help="vocabulary of the emulated draft")
    drf.add_argument("--draft-address", metavar="HOST:PORT", help="use a draft that is already serving")
    drf.add_argument("--draft-load-url", metavar="URL", help="its /v1/load URL (with --draft-address)")
    sweep = parser.add_argument_group("the sweep")
    sweep.add_argument(
        "--n", type=target_counts, metavar="N,N,...", help="target counts (default 1,2,4,8,16,32 and N*; 1 always)"
    )
    sweep.add_argument(
        "--drafts",
        type=target_counts,
        metavar="D,D,...",
        help="instead of the sweep over N: D emulated drafts with D x N* targets (each on its first-choice draft), "
        "total throughput against D x one draft's at N*",
    )
    sweep.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    sweep.add_argument("--warmup", type=float, default=1.0, help="seconds per point before measuring")
    sweep.add_argument("--session-tokens", type=int, default=512, help="tokens per emulated completion")
    sweep.add_argument("--seed", type=int, default=0, help="seed of the acceptance draws")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    out.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot")
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def build_config(args: argparse.Namespace) -> tuple[StarConfig, list[str]]:
    """The sweep's StarConfig and the draft's extra command-line arguments (ValueError on bad input)."""
    from starsd.bench import profiles
    from starsd.bench.star import StarConfig, sweep_ns

    if args.profile and args.profile_json:
        raise ValueError("give --profile or --profile-json, not both")
    prof = (
        profiles.load_profile_json(args.profile_json)
        if args.profile_json
        else profiles.get(args.profile or profiles.DEFAULT_PROFILE)
    )
    changes: dict[str, object] = {}
    for key in ("tp", "tc", "alpha", "gamma"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    if args.draft_model and args.draft_service_time is not None:
        raise ValueError("give --draft-service-time (emulated draft) or --draft-model, not both")
    real_draft = args.draft_model is not None or args.draft_address is not None
    service = None if real_draft else (args.draft_service_time or prof.tq)
    if service is not None and service != prof.tq:
        changes["tq"] = service
    curve_text = args.batch_curve
    if curve_text:
        given = system_model.BatchCurve.parse(curve_text, unbatched=service if service is not None else prof.tq)
        changes["batch_curve"] = given.points
        changes["tq"] = given.tq(1)
        service = given.tq(1) if service is not None else None
    elif "tq" in changes and prof.batch_curve:
        changes["batch_curve"] = ()  # the profile's curve belongs to its own Tq
    if changes:
        prof = dataclasses.replace(prof, **changes)  # type: ignore[arg-type]
    if args.max_batch < 1:
        raise ValueError("--max-batch must be >= 1")
    if args.duration <= 0 or args.warmup < 0:
        raise ValueError("--duration must be > 0 and --warmup >= 0")
    if args.session_tokens < 1:
        raise ValueError("--session-tokens must be >= 1")
    cfg = StarConfig(prof, (), args.duration, args.warmup, service, args.max_batch, args.seed, args.session_tokens)
    cfg = dataclasses.replace(cfg, ns=sweep_ns(args.n, cfg.model_inputs(prof.tq).optimal_targets()))
    extra: list[str] = ["--max-gamma", str(max(16, prof.gamma)), "--max-sessions", str(4 * max(cfg.ns) + 64)]
    if args.draft_model is None:
        extra += ["--vocab-size", str(args.vocab_size)]
        curve = prof.curve()
        if args.max_batch > 1:
            if curve is None:
                raise ValueError("--max-batch > 1 with an emulated draft needs a batch curve (--batch-curve)")
            extra += ["--batch-curve", ",".join(f"{b}:{t!r}" for b, t in curve.points)]
    if args.max_batch > 1:
        extra += ["--max-batch", str(args.max_batch)]
    return cfg, extra


def run(args: argparse.Namespace) -> int:
    try:
        cfg, extra = build_config(args)
    except (ValueError, OSError) as exc:
        return error(str(exc), "star")
    if args.draft_load_url and not args.draft_address:
        return error("--draft-load-url goes with --draft-address", "star")
    if args.drafts is not None:
        return run_several_drafts(cfg, extra, args)
    try:
        report = asyncio.run(_sweep(cfg, extra, args))
    except RuntimeError as exc:
        return error(str(exc), "star")
    publish(report, args.json)
    if args.plot:
        from starsd.bench.plot import plot_star

        plot_star(report, cfg.model_inputs(report.measured_service_time), args.plot)
        print(f"wrote {args.plot}")
    return 0


def run_several_drafts(cfg: StarConfig, extra: list[str], args: argparse.Namespace) -> int:
    """``bench star --drafts``: D emulated drafts and D x N* targets (:mod:`starsd.bench.drafts`)."""
    from starsd.bench.drafts import run_drafts

    if cfg.draft_service_time is None or args.draft_address:
        return error("--drafts runs emulated drafts: not with --draft-model or --draft-address", "star")
    try:
        report = asyncio.run(run_drafts(cfg, args.drafts, extra))
    except RuntimeError as exc:
        return error(str(exc), "star")
    return publish(report, args.json)


async def _sweep(cfg: StarConfig, extra: list[str], args: argparse.Namespace) -> StarReport:
    from starsd.bench.analysis import PointMeasurement
    from starsd.bench.harness import DraftEndpoint, local_draft, reach_draft
    from starsd.bench.star import run_star

    started = time.perf_counter()

    def progress(n: int, m: PointMeasurement) -> None:
        if not args.quiet:
            errors = sum(1 for run in m.runs if run.error)
            rounds = sum(len(run.rounds) for run in m.runs)
            print(
                f"  N={n:<3} {rounds} rounds{f', {errors} target errors' if errors else ''} "
                f"({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
            )

    async def sweep(endpoint: DraftEndpoint) -> StarReport:
        if not args.quiet:
            print(f"sweeping N = {', '.join(map(str, cfg.ns))}", file=sys.stderr)
        return await run_star(cfg, endpoint, progress)

    if args.draft_address:
        return await sweep(await reach_draft(args.draft_address, args.draft_load_url))
    source = f"--model {args.draft_model}" if args.draft_model else f"--emulate-service-time {cfg.draft_service_time}"
    if not args.quiet:
        print(f"starting the draft: starsd draft {source} {' '.join(extra)}", file=sys.stderr)
    async with local_draft(args.draft_model, cfg.draft_service_time, extra) as endpoint:
        return await sweep(endpoint)
