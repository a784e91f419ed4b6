"""``starsd plan``: the system model's table over N (regime, utilisation, throughput, latency), marking N*.

Times come from flags, from a named accelerator profile (``--profile``) or from a profile file
(``--profile-json``); flags given explicitly override the profile's values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from starsd import system_model
from starsd.commands._common import add_profile_args, target_counts


def _betas(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated probabilities, got {text!r}") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The system model of one draft serving N targets (docs/architecture.md section 2): for each N, the "
        "regime, the draft's utilisation, total throughput O(N), per-target throughput and latency per token. "
        "N* (the fewest targets that keep the draft busy) is marked."
    )
    src = parser.add_argument_group("times and acceptance (flags override a profile)")
    add_profile_args(src)
    src.add_argument("--tq", type=float, help="draft service time for one request, seconds")
    acc = src.add_mutually_exclusive_group()
    acc.add_argument("--alpha", type=float, help="constant per-position acceptance probability")
    acc.add_argument("--betas", type=_betas, help="per-position acceptance beta(1..gamma), comma separated")
    src.add_argument(
        "--batch-curve",
        metavar="B:S,...",
        help='the draft\'s batched service time Tq(B), e.g. "1:0.004,8:0.006" (B=1 defaults to --tq)',
    )
    star = parser.add_argument_group(
        "several drafts (--gpus G): the best number of drafts D and targets N",
        "With --gpus, also the best (D, N) with D + N <= G, one accelerator per draft and per target: by "
        "throughput (tokens/s) and by throughput per cost (tokens/s per unit of --draft-cost/--target-cost), "
        "and for each D its best N. D drafts keep D x N* targets busy; targets past that only queue.",
    )
    star.add_argument("--gpus", type=int, metavar="G", help="accelerators to share between drafts and targets")
    star.add_argument(
        "--draft-cost", type=float, default=1.0, metavar="X", help="cost of one draft accelerator (default 1)"
    )
    star.add_argument(
        "--target-cost", type=float, default=1.0, metavar="Y", help="cost of one target accelerator (default 1)"
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--max-n", type=int, help="rows up to N = MAX_N (default max(8, 2*N*); past 64, powers of two and N*)"
    )
    out.add_argument("--n", type=target_counts, metavar="N,N,...", help="exactly these N (overrides --max-n)")
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Merge the profile (if any) with explicit flags; returns tq, tp, tc, gamma, alpha, betas, curve."""
    values: dict[str, Any] = {"tq": None, "tp": None, "tc": None, "gamma": None, "alpha": None, "betas": None}
    curve_text: str | None = None
    name: str | None = None
    if args.profile or args.profile_json:
        from starsd.bench import profiles  # no torch, no grpc: cheap

        prof = profiles.load_profile_json(args.profile_json) if args.profile_json else profiles.get(args.profile)
        name = prof.name
        values.update(tq=prof.tq, tp=prof.tp, tc=prof.tc, gamma=prof.gamma, alpha=prof.alpha, betas=None)
        if prof.batch_curve:
            curve_text = ",".join(f"{b}:{t}" for b, t in prof.batch_curve)
    for key in ("tq", "tp", "tc", "gamma"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.alpha is not None:
        values.update(alpha=args.alpha, betas=None)
    if args.betas is not None:
        values.update(betas=args.betas, alpha=None)
    if args.batch_curve is not None:
        curve_text = args.batch_curve
    curve: system_model.BatchCurve | None = None
    if curve_text:
        if values["tq"] is None and "1:" not in curve_text.replace(" ", ""):
            raise ValueError("missing --tq (or a 1:SECONDS point in --batch-curve)")
        curve = system_model.BatchCurve.parse(curve_text, unbatched=values["tq"])
        if args.tq is None:
            values["tq"] = curve.tq(1)
    missing = [f"--{k}" for k in ("tq", "tp", "tc", "gamma") if values[k] is None]
    if values["alpha"] is None and values["betas"] is None:
        missing.append("--alpha or --betas")
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (give them, or a --profile / --profile-json)")
    values["curve"] = curve
    values["profile"] = name
    return values


def default_ns(n_star: int, max_n: int | None = None) -> list[int]:
    """Every N up to ``max_n`` (default ``max(8, 2*N*)``) when that is at most 64 rows; beyond, powers of two
    plus the neighbours of N*, so a large batched N* still gives a short table."""
    top = max_n or max(8, 2 * n_star)
    if top <= 64:
        return list(range(1, top + 1))
    ns = {1 << k for k in range(top.bit_length()) if 1 << k <= top}
    ns |= {n for n in (n_star - 1, n_star, n_star + 1, top) if 1 <= n <= top}
    return sorted(ns)


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``starsd plan`` prints, as plain data (raises ValueError on bad input)."""
    v = _resolve(args)
    tq, tp, tc, gamma, alpha, betas = v["tq"], v["tp"], v["tc"], v["gamma"], v["alpha"], v["betas"]
    curve: system_model.BatchCurve | None = v["curve"]
    model = system_model.StarInputs(tq, tp, tc, gamma, alpha, betas, curve)
    unbatched = dataclasses.replace(model, batch_curve=None)
    n_star = model.optimal_targets
    if args.n:
        ns: Sequence[int] = args.n
    else:
        if args.max_n is not None and args.max_n < 1:
            raise ValueError(f"--max-n must be >= 1, got {args.max_n}")
        ns = default_ns(n_star, args.max_n)
    rows = system_model.plan_table(model, ns)
    tokens = model.tokens_per_round
    report: dict[str, Any] = {
        "inputs": {
            "profile": v["profile"],
            "tq": tq,
            "tp": tp,
            "tc": tc,
            "gamma": gamma,
            "alpha": alpha,
            "betas": betas,
            "batch_curve": [list(p) for p in curve.points] if curve else None,
        },
        "expected_accepted_length": tokens - 1.0,
        "expected_tokens_per_round": tokens,
        "cycle_time": model.cycle_time,
        "optimal_targets": n_star,
        "optimal_targets_unbatched": unbatched.optimal_targets,
        "draft_capacity": model.capacity,
        "rows": [r.to_dict() for r in rows],
    }
    if args.gpus is not None:
        if args.gpus < 2:
            raise ValueError(f"--gpus must be >= 2 (one draft and one target), got {args.gpus}")
        for flag, value in (("--draft-cost", args.draft_cost), ("--target-cost", args.target_cost)):
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{flag} must be a number > 0, got {value}")
        costs = system_model.Costs(args.draft_cost, args.target_cost)
        report["star"] = system_model.best_star_for(model, args.gpus, costs).to_dict()
    if curve:
        best = curve.best_batch()
        report["batching"] = {
            "best_batch": best,
            "tq_best_batch": curve.tq(best),
            "per_request_time": curve.per_request_time(best),
            "gain": curve.batching_gain(),
            "capacity_unbatched": unbatched.capacity,
        }
    return report


def format_report(report: dict[str, Any]) -> str:
    inp = report["inputs"]
    acc = f"alpha={inp['alpha']}" if inp["alpha"] is not None else f"betas={inp['betas']}"
    lines = []
    if inp["profile"]:
        lines.append(f"profile {inp['profile']}")
    lines.append(
        f"Tq={inp['tq'] * 1e3:.3f} ms  Tp={inp['tp'] * 1e3:.3f} ms  Tc={inp['tc'] * 1e3:.3f} ms  "
        f"gamma={inp['gamma']}  {acc}"
    )
    lines.append(
        f"E[l]+1 = {report['expected_tokens_per_round']:.3f} tokens/round   C = Tq+Tp+2Tc = "
        f"{report['cycle_time'] * 1e3:.3f} ms   N* = {report['optimal_targets']}   "
        f"draft capacity = {report['draft_capacity']:.1f} tokens/s"
    )
    batched = "batching" in report
    if batched:
        b = report["batching"]
        lines.append(
            f"batching: Tq({b['best_batch']}) = {b['tq_best_batch'] * 1e3:.3f} ms, so a request costs the draft "
            f"{b['per_request_time'] * 1e3:.3f} ms instead of {inp['tq'] * 1e3:.3f} ms (x{b['gain']:.2f} capacity);"
        )
        lines.append(
            f"  a memory-bound draft's Tq(B) grows slowly with B, so it feeds N* = {report['optimal_targets']} "
            f"targets instead of {report['optimal_targets_unbatched']}"
        )
    header = f"{'N':>5}  {'regime':<11}  {'util':>6}  " + (f"{'B':>3}  " if batched else "")
    header += f"{'tokens/s':>10}  {'per target':>10}  {'ms/token':>9}  {'round ms':>9}"
    lines += ["", header, "-" * len(header)]
    for r in report["rows"]:
        line = f"{r['n']:>5}  {r['regime']:<11}  {r['utilization'] * 100:>5.1f}%  "
        if batched:
            line += f"{r['batch']:>3}  "
        line += (
            f"{r['throughput']:>10.1f}  {r['per_target_throughput']:>10.1f}  "
            f"{r['latency_per_token'] * 1e3:>9.3f}  {r['round_time'] * 1e3:>9.3f}"
        )
        if r["optimal"]:
            line += "  <- N*"
        lines.append(line)
    if "star" in report:
        lines += ["", *format_star(report["star"])]
    return "\n".join(lines)


def format_star(star: dict[str, Any]) -> list[str]:
    """The ``--gpus`` section: the best (D, N) by throughput and per cost, and each D's best N."""
    bt, bc = star["best_throughput"], star["best_per_cost"]
    lines = [
        f"{star['gpus']} accelerators, a draft costs {star['draft_cost']:g} and a target {star['target_cost']:g}; "
        f"one draft keeps N* = {star['optimal_targets']} targets busy, D drafts D x N*",
        f"best by throughput:          D = {bt['drafts']} drafts, N = {bt['targets']} targets "
        f"({bt['throughput']:.1f} tokens/s, cost {bt['cost']:g})",
        f"best by throughput per cost: D = {bc['drafts']} drafts, N = {bc['targets']} targets "
        f"({bc['throughput']:.1f} tokens/s, cost {bc['cost']:g}, {bc['throughput_per_cost']:.2f} tokens/s per cost)",
        "",
    ]
    header = f"{'D':>3}  {'N':>4}  {'N/D':>5}  {'regime':<11}  {'util':>6}  {'tokens/s':>10}  "
    header += f"{'cost':>8}  {'tok/s/cost':>10}"
    lines += [header, "-" * len(header)]
    for o in star["by_drafts"]:
        line = (
            f"{o['drafts']:>3}  {o['targets']:>4}  {o['targets_per_draft']:>5.1f}  {o['regime']:<11}  "
            f"{o['utilization'] * 100:>5.1f}%  {o['throughput']:>10.1f}  {o['cost']:>8g}  "
            f"{o['throughput_per_cost']:>10.2f}"
        )
        marks = [
            m
            for m, b in (("throughput", bt), ("per cost", bc))
            if (b["drafts"], b["targets"])
            == (
                o["drafts"],
                o["targets"],
            )
        ]
        if marks:
            line += "  <- best " + ", ".join(marks)
        lines.append(line)
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        report = build_report(args)
    except (ValueError, OSError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"starsd plan: {msg}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0
