"""``starsd bench``: ``star`` (the star benchmark against the system model) and ``profiles`` (the table)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from starsd import system_model

if TYPE_CHECKING:  # the benchmark's modules import grpc and aiohttp: only when a benchmark runs
    from starsd.bench.star import StarConfig, StarReport


def _n_list(text: str) -> tuple[int, ...]:
    try:
        ns = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated target counts, got {text!r}") from None
    if not ns or ns[0] < 1:
        raise argparse.ArgumentTypeError(f"target counts must be >= 1, got {text!r}")
    return ns


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    star = sub.add_parser(
        "star",
        help="N emulated targets on the real draft server, swept over N, against the system model",
        description=(
            "Starts the real draft server (emulating a draft accelerator's service time, or a real checkpoint "
            "with --draft-model) and N emulated targets in this process: the target's own engine and draft link "
            "with a model step whose verify time and acceptance follow an accelerator profile. Sweeps N and "
            "reports throughput, draft "
            "utilisation and idle gaps, per-target latency and measured/model throughput, with the "
            "target-only and N-independent-pairs baselines."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = star.add_argument_group("profile (flags override its values)")
    src.add_argument("--profile", help="a named profile (`starsd bench profiles`); default tpuv4-chinchilla70b-4b")
    src.add_argument("--profile-json", metavar="FILE", help="a profile of your own")
    src.add_argument("--tp", type=float, help="target verify time per round, seconds")
    src.add_argument("--tc", type=float, help="one-way transfer time added by the emulated targets, seconds")
    src.add_argument("--alpha", type=float, help="per-position acceptance probability")
    src.add_argument("--gamma", type=int, help="draft tokens per round")
    drf = star.add_argument_group("the draft")
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
    run = star.add_argument_group("the sweep")
    run.add_argument(
        "--n", type=_n_list, metavar="N,N,...", help="target counts (default 1,2,4,8,16,32 and N*; 1 always)"
    )
    run.add_argument(
        "--drafts",
        type=_n_list,
        metavar="D,D,...",
        help="instead of the sweep over N: D emulated drafts with D x N* targets (each on its first-choice draft), "
        "total throughput against D x one draft's at N*",
    )
    run.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    run.add_argument("--warmup", type=float, default=1.0, help="seconds per point before measuring")
    run.add_argument("--session-tokens", type=int, default=512, help="tokens per emulated completion")
    run.add_argument("--seed", type=int, default=0, help="seed of the acceptance draws")
    out = star.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    out.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG plot")
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    star.set_defaults(_bench=run_star_command)

    prof = sub.add_parser("profiles", help="the accelerator profiles and their sources")
    prof.add_argument("--json", action="store_true", help="print JSON")
    prof.set_defaults(_bench=run_profiles_command)
    configure_draft_benchmarks(sub)
    from starsd.commands.bench_gpu import configure_measure_gpu
    from starsd.commands.bench_serve import configure_serve
    from starsd.commands.bench_step import configure_step

    configure_serve(sub)
    configure_measure_gpu(sub)
    configure_step(sub)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_bench", None)
    if handler is None:
        print(
            "starsd bench: choose a benchmark: star | serve | profiles | capacity | fairness | gamma | protocol | "
            "measure-gpu | step (see --help)",
            file=sys.stderr,
        )
        return 2
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # the emulated targets' connects are noise here
        logging.getLogger("starsd.verifier").setLevel(logging.WARNING)
    return int(handler(args))


def run_profiles_command(args: argparse.Namespace) -> int:
    from starsd.bench import profiles

    if args.json:
        print(json.dumps([p.to_dict() for p in profiles.PROFILES], indent=2))
    else:
        print("\n\n".join(profiles.describe(p) for p in profiles.PROFILES))
    return 0


def _error(message: str, bench: str = "star") -> int:
    print(f"starsd bench {bench}: {message}", file=sys.stderr)
    return 2


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


def run_star_command(args: argparse.Namespace) -> int:
    try:
        cfg, extra = build_config(args)
    except (ValueError, OSError) as exc:
        return _error(str(exc))
    if args.draft_load_url and not args.draft_address:
        return _error("--draft-load-url goes with --draft-address")
    if args.drafts is not None:
        return run_drafts_command(cfg, extra, args)
    try:
        report = asyncio.run(_run(cfg, extra, args))
    except RuntimeError as exc:
        return _error(str(exc))
    from starsd.bench.report import write_json

    print(report.table())
    write_json(args.json, report)
    if args.plot:
        from starsd.bench.plot import plot_star

        plot_star(report, cfg.model_inputs(report.measured_service_time), args.plot)
        print(f"wrote {args.plot}")
    return 0


def run_drafts_command(cfg: StarConfig, extra: list[str], args: argparse.Namespace) -> int:
    """``bench star --drafts``: D emulated drafts and D x N* targets (:mod:`starsd.bench.drafts`)."""
    from starsd.bench.drafts import run_drafts
    from starsd.bench.report import write_json

    if cfg.draft_service_time is None or args.draft_address:
        return _error("--drafts runs emulated drafts: not with --draft-model or --draft-address")
    try:
        report = asyncio.run(run_drafts(cfg, args.drafts, extra))
    except RuntimeError as exc:
        return _error(str(exc))
    print(report.table())
    write_json(args.json, report)
    return 0


async def _run(cfg: StarConfig, extra: list[str], args: argparse.Namespace) -> StarReport:
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


# --- the draft's benchmarks: batched drafting, fair scheduling, adaptive gamma; and the protocol overhead ---

DEFAULT_DRAFT_MODEL = Path("models/draft")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return values


def configure_draft_benchmarks(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    cap = sub.add_parser(
        "capacity",
        help="draft capacity (requests/s at saturation) of the real draft, one-at-a-time vs batched",
        formatter_class=fmt,
    )
    cap.add_argument("--draft-model", type=Path, default=DEFAULT_DRAFT_MODEL, help="draft checkpoint")
    cap.add_argument("--batches", type=_int_list, default=(1, 8), help="--max-batch values, the first the baseline")
    cap.add_argument("--sessions", type=int, default=32, help="saturating sessions (zero verify time)")
    cap.add_argument("--gamma", type=int, default=4, help="draft tokens per request")
    cap.add_argument(
        "--session-tokens", type=int, default=512, help="tokens per session before it is released (its context)"
    )
    cap.add_argument("--duration", type=float, default=8.0, help="measured seconds per batch size and pass")
    cap.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring, per window")
    cap.add_argument("--repeats", type=int, default=3, help="interleaved passes over the batch sizes (medians)")
    cap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    cap.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    cap.set_defaults(_bench=run_capacity_command)

    fair = sub.add_parser(
        "fairness", help="skewed demand on a fully loaded draft: --schedule fifo vs fair", formatter_class=fmt
    )
    fair.add_argument("--busy-sessions", type=int, default=16, help="sessions of the busy target")
    fair.add_argument("--small-targets", type=int, default=3, help="targets with one session each")
    fair.add_argument("--tq", type=float, default=0.004, help="emulated draft service time, seconds")
    fair.add_argument("--tp", type=float, default=0.002, help="emulated verify time, seconds")
    fair.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    fair.add_argument("--alpha", type=float, default=0.7, help="per-position acceptance")
    fair.add_argument("--duration", type=float, default=15.0, help="measured seconds per schedule")
    fair.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    fair.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    fair.set_defaults(_bench=run_fairness_command)

    gam = sub.add_parser(
        "gamma",
        help="fixed gamma 1..8 vs adaptive gamma, per shipped profile, at N* and 4xN*",
        formatter_class=fmt,
    )
    gam.add_argument("--profiles", help="comma-separated profile names (default: every shipped profile)")
    gam.add_argument("--gammas", type=_int_list, default=tuple(range(1, 9)), help="fixed gammas to compare")
    gam.add_argument("--n-multipliers", type=_int_list, default=(1, 4), help="N = N* times each")
    gam.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    gam.add_argument("--warmup", type=float, default=1.0, help="seconds per point before measuring")
    gam.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    gam.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    gam.set_defaults(_bench=run_gamma_command)

    proto = sub.add_parser(
        "protocol", help="protocol overhead per round on loopback (greedy and sampled)", formatter_class=fmt
    )
    proto.add_argument("--draft-model", type=Path, default=DEFAULT_DRAFT_MODEL, help="draft checkpoint")
    proto.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    proto.add_argument("--rounds", type=int, default=500, help="measured rounds per mode")
    proto.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    proto.set_defaults(_bench=run_protocol_command)


def _draft_model(path: Path, name: str) -> Path | None:
    if (path / "config.json").exists():
        return path
    print(
        f"starsd bench {name}: no draft checkpoint at {path} (`starsd models tiny --out DIR` writes one)",
        file=sys.stderr,
    )
    return None


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr)


def run_capacity_command(args: argparse.Namespace) -> int:
    from starsd.bench.capacity import CapacityReport, measure_capacity, summarise_capacity
    from starsd.bench.report import Machine, write_json

    draft = _draft_model(args.draft_model, "capacity")
    if draft is None:
        return 2
    if min(args.sessions, args.gamma, args.session_tokens, args.repeats) < 1 or args.duration <= 0 or args.warmup < 0:
        return _error(
            "--sessions, --gamma, --session-tokens, --repeats >= 1, --duration > 0, --warmup >= 0", "capacity"
        )
    machine = Machine.now()
    try:
        points = asyncio.run(
            measure_capacity(
                str(draft),
                args.batches,
                args.sessions,
                args.gamma,
                args.warmup,
                args.duration,
                args.session_tokens,
                args.repeats,
                None if args.quiet else _stderr_line,
            )
        )
    except RuntimeError as exc:
        return _error(str(exc), "capacity")
    summary = summarise_capacity(points)
    report = CapacityReport(str(draft), args.session_tokens, args.repeats, machine.finished(), summary, points)
    print(report.table())
    write_json(args.json, report)
    return 0


def run_fairness_command(args: argparse.Namespace) -> int:
    from starsd.bench.fairness import FairnessConfig, FairnessReport, measure_fairness
    from starsd.bench.report import Machine, write_json

    if args.busy_sessions < 1 or args.small_targets < 1 or args.tq <= 0 or args.tp < 0 or args.duration <= 0:
        return _error("--busy-sessions, --small-targets >= 1, --tq > 0, --tp >= 0, --duration > 0", "fairness")
    config = FairnessConfig(
        args.busy_sessions, args.small_targets, args.tq, args.tp, args.gamma, args.alpha, args.duration, args.warmup
    )
    machine = Machine.now()
    try:
        points = asyncio.run(measure_fairness(("fifo", "fair"), config))
    except RuntimeError as exc:
        return _error(str(exc), "fairness")
    report = FairnessReport(config, machine.finished(), points)
    print(report.table())
    write_json(args.json, report)
    return 0


def run_gamma_command(args: argparse.Namespace) -> int:
    from starsd.bench import profiles
    from starsd.bench.gamma import GammaReport, measure_gamma, summarise_gamma
    from starsd.bench.report import Machine, write_json

    names = [n.strip() for n in args.profiles.split(",")] if args.profiles else profiles.names()
    try:
        for name in names:
            profiles.get(name)
    except (KeyError, ValueError) as exc:
        return _error(str(exc), "gamma")
    if args.duration <= 0 or args.warmup < 0:
        return _error("--duration must be > 0 and --warmup >= 0", "gamma")
    machine = Machine.now()
    try:
        points = asyncio.run(
            measure_gamma(
                names,
                args.gammas,
                args.n_multipliers,
                args.warmup,
                args.duration,
                max(args.gammas),
                None if args.quiet else _stderr_line,
            )
        )
    except RuntimeError as exc:
        return _error(str(exc), "gamma")
    report = GammaReport(machine.finished(), points, summarise_gamma(points))
    print(report.table())
    write_json(args.json, report)
    return 0


def run_protocol_command(args: argparse.Namespace) -> int:
    from starsd.bench import protocol
    from starsd.bench.report import Machine, write_json

    draft = _draft_model(args.draft_model, "protocol")
    if draft is None:
        return 2
    machine = Machine.now()
    try:
        results = protocol.run(draft, gamma=args.gamma, rounds=args.rounds)
    except RuntimeError as exc:
        return _error(str(exc), "protocol")
    report = protocol.ProtocolReport(str(draft), machine.finished(), results)
    print(report.table())
    write_json(args.json, report)
    return 0
