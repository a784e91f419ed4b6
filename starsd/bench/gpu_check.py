"""The stages of the GPU check (``bench/gpu/run.sh``, ``make gpu-check``), one per call, each writing its JSON into
the results folder as soon as it has something to say::

    python3 -m starsd.bench.gpu_check STAGE --out DIR [--small]

``preflight`` (versions, ``nvidia-smi``, the project's imports, device-to-device copy bandwidth),
``correctness`` (the test suite's CUDA variants, the greedy probes in bf16 and fp32, the self-draft probe),
``step`` (``starsd bench step`` of the ~1B draft and ~8B target in bf16, eager and CUDA graphs where the
runners have them), ``star`` (:mod:`starsd.bench.inproc_star` with 1, 2 and 4 targets at acceptance 0.7),
``smoke`` (``starsd local`` with the shipped pair: 16 concurrent greedy completions against the target alone),
``profile`` (the measured profile for ``starsd/bench/measured/`` and the goals' verdicts, from the files above).

``--small`` is the CPU path of the same stages (tiny shapes, fp32, a few repeats: seconds), run by the test suite
so that the script cannot rot. Without a GPU the CUDA-only parts say so in their JSON instead of running.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import importlib.metadata
import json
import platform
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

STAGES = ("preflight", "correctness", "step", "star", "smoke", "profile")
IMPORTS = (
    "grpc",
    "grpc_health.v1.health",
    "google.protobuf",
    "aiohttp",
    "prometheus_client",
    "starsd.proto.starsd_pb2",
    "starsd.proto.starsd_pb2_grpc",
    "starsd.draft.server",
    "starsd.openai_api.app",
    "starsd.local",
    "starsd.cli",
)
VERSIONS = (  # distributions
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "grpcio",
    "grpcio-health-checking",
    "protobuf",
    "aiohttp",
    "prometheus-client",
    "pytest",
)
# The test suite's CUDA variants (each skips with its reason where no GPU is visible), the CUDA graphs' replays
# against eager steps among them.
CUDA_TESTS = (
    "tests/bench/test_lossless_on_device.py",
    "tests/integration/test_batching.py",
    "tests/test_cuda_graphs.py::test_replayed_drafting_equals_eager_drafting_on_cuda",
    "tests/test_cuda_graphs.py::test_replayed_verification_equals_eager_verification_on_cuda",
)
PROMPTS = (
    "def __init__(self",
    "import os\nimport sys\n",
    "class Parser:\n    def parse(self, text):\n",
    "for i in range(",
    "    return self._",
    'if __name__ == "__main__":\n',
    "def read_file(path):\n    with open(",
    "try:\n    import ",
    "# Copyright",
    "    raise ValueError(",
    "self.assertEqual(",
    "def test_",
    "with open(path) as f:\n",
    "from typing import ",
    "    for key, value in ",
    "print(",
)
GAMMA, ALPHA, CONTEXT = 4, 0.7, 1024


def _write(out: Path, name: str, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"{name}.json.partial"
    partial.write_text(json.dumps(data, indent=2))
    partial.replace(out / f"{name}.json")


def _read(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# --- preflight ----------------------------------------------------------------------------------------------


def copy_bandwidth(device: str, mib: int, repeats: int = 10) -> dict[str, float]:
    """Device-to-device copy of ``mib`` MiB: milliseconds per GiB copied and the bytes moved per second (read
    plus write, the figure a memory-bound step's weight reads are held to)."""
    import torch

    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        if src.device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
    seconds = sorted(times)[len(times) // 2]
    return {
        "bytes": src.numel(),
        "ms_per_gib": round(seconds / (src.numel() / 2**30) * 1e3, 4),
        "read_write_bytes_per_s": round(2 * src.numel() / seconds, 1),
    }


def preflight(out: Path, small: bool) -> dict[str, Any]:
    import torch

    versions: dict[str, str] = {"python": platform.python_version()}
    for name in VERSIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    imports = {}
    for name in IMPORTS:
        try:
            importlib.import_module(name)
            imports[name] = "ok"
        except Exception as exc:
            imports[name] = f"{type(exc).__name__}: {exc}"
    smi = shutil.which("nvidia-smi")
    nvidia = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout if smi else "no nvidia-smi"
    cuda = _cuda()
    device = "cuda" if cuda else "cpu"
    return {
        "versions": versions,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "nvidia_smi": nvidia,
        "imports": imports,
        "imports_ok": all(v == "ok" for v in imports.values()),
        "copy": copy_bandwidth(device, 16 if small or not cuda else 1024),
    }


# --- correctness --------------------------------------------------------------------------------------------


def junit_outcomes(path: Path) -> list[dict[str, str]]:
    """Each test case of a JUnit XML report: its id and outcome (passed, failed, error, skipped) with the reason."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                reason = (child.get("message") or "")[:500]
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "reason": reason})
    return cases


def _prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


def correctness(out: Path, small: bool) -> dict[str, Any]:
    from starsd.bench.lossless import greedy_probe, self_draft_probe
    from starsd.checkpoints import load_checkpoint
    from starsd.tiny import shipped_pair

    result: dict[str, Any] = {}
    junit = out / "correctness-junit.xml"
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "timeout=90",
        *CUDA_TESTS,
        "-k",
        "cuda",
    ]
    started = time.perf_counter()
    proc = subprocess.run([*args, f"--junitxml={junit}"], capture_output=True, text=True, timeout=600)
    cases = junit_outcomes(junit) if junit.exists() else []
    result["cuda_tests"] = {
        "command": " ".join(args[1:]),
        "exit_status": proc.returncode,  # 5: nothing collected
        "seconds": round(time.perf_counter() - started, 1),
        "cases": cases,
        "passed": sum(c["outcome"] == "passed" for c in cases),  # 0 where no GPU is visible: all skip
        "failed": sum(c["outcome"] in ("failed", "error") for c in cases),
        "skipped": sum(c["outcome"] == "skipped" for c in cases),
        "tail": proc.stdout[-2000:],
    }
    _write(out, "correctness", result)
    device = "cuda" if _cuda() else "cpu"
    pair = shipped_pair()
    tokens = 8 if small else 48
    for dtype in ("float32", "bfloat16"):
        draft, target = (load_checkpoint(path, device, dtype) for path in (pair.draft, pair.target))
        prompts = _prompts(target.tokenizer)[: 4 if small else 16]
        result[f"greedy_{dtype}"] = greedy_probe(draft, target, prompts, tokens, GAMMA).to_dict()
        result[f"self_draft_{dtype}"] = self_draft_probe(target, prompts, tokens, GAMMA)
        _write(out, "correctness", result)
    result["device"] = device
    fp32 = result["greedy_float32"]
    result["passed"] = (
        result["cuda_tests"]["failed"] == 0
        and fp32["identical_outputs"] == fp32["prompts"]
        and result["greedy_bfloat16"]["over_tolerance"] == 0
    )
    return result


# --- the step table and the in-process star -----------------------------------------------------------------


def step(out: Path, small: bool, budget: float) -> dict[str, Any]:
    from starsd.bench.step import StepPlan, run_step_bench, write_report

    if small:
        tiny = {"batches": (1, 4), "gammas": (2, 4), "contexts": (32,), "warmup": 1, "repeats": 2}
        plan = StepPlan("tiny", "tiny", device="cpu", dtype="float32", **tiny)  # type: ignore[arg-type]
    else:
        plan = StepPlan(contexts=(CONTEXT,), device="cuda", dtype="bfloat16", warmup=2, repeats=3, budget=budget)
    report = run_step_bench(plan, _progress, write_report(out / "step.json"))
    print(report.table(), file=sys.stderr)
    return report.to_dict()


def step_prediction(step_data: dict[str, Any] | None, mode: str = "eager") -> tuple[Any, float] | None:
    """``(Tq(B) curve, Tp)`` at gamma 4 from a step report (the draft's consecutive rows, the target's B=1)."""
    from starsd import system_model

    if not step_data:
        return None
    rows = [r for r in step_data["rows"] if r["gamma"] == GAMMA and r["mode"] == mode and r["slots"] == "consecutive"]
    curve_points: list[tuple[int, float]] = []
    for r in sorted((r for r in rows if r["role"] == "draft"), key=lambda r: r["batch"]):
        t = r["wall_ms"] / 1e3
        curve_points.append((r["batch"], max(t, curve_points[-1][1]) if curve_points else t))
    tp = next((r["wall_ms"] / 1e3 for r in rows if r["role"] == "target" and r["batch"] == 1), None)
    if not curve_points or curve_points[0][0] != 1 or tp is None:
        return None
    return system_model.BatchCurve(tuple(curve_points)), tp


def device_figures(step_data: dict[str, Any], mode: str) -> dict[str, Any]:
    """Where one step's time goes, for the target's and the draft's gamma-4 step of one session: the operators the
    host dispatched, the device's kernel time and the share of the step's CUDA time the device sat idle waiting
    for the host (near 1: launch-bound); and the graph captures that fell inside the timed steps of ``mode``."""
    figures: dict[str, Any] = {}
    rows = [r for r in step_data["rows"] if r["mode"] == mode]
    for role, prefix in (("target", "tp"), ("draft", "tq")):
        row = next(
            (r for r in rows if (r["role"], r["gamma"], r["batch"], r["slots"]) == (role, GAMMA, 1, "consecutive")),
            None,
        )
        if row is None:
            continue
        figures[f"{prefix}_ops"] = row.get("ops")
        kernel, cuda = row.get("kernel_ms"), row.get("cuda_ms")
        if kernel is not None and cuda:
            figures[f"{prefix}_kernel_ms"] = kernel
            figures[f"{prefix}_device_idle_share"] = round(max(0.0, 1 - kernel / cuda), 3)
    if mode == "graphs":
        figures["captures_while_timed"] = sum(r.get("captures") or 0 for r in rows)
    return figures


def star(out: Path, small: bool) -> dict[str, Any]:
    from starsd.bench.inproc_star import point_dict, run_point
    from starsd.bench.measure_gpu import describe, load_model
    from starsd.bench.step import graphs_parameter
    from starsd.draft.runner import DraftRunner
    from starsd.verifier.runner import TargetRunner

    draft_model, target_model = ("tiny", "tiny") if small else ("llama-1b", "llama-8b")
    device, dtype = ("cpu", "float32") if small else ("cuda", "bfloat16")
    context, rounds = (32, 6) if small else (CONTEXT, 20)
    draft, target = load_model(draft_model, device, dtype), load_model(target_model, device, dtype)
    # The servers' own default: CUDA graphs where the runners have them (on CUDA), else eager steps.
    graphs = device == "cuda" and all(graphs_parameter(c) is not None for c in (DraftRunner, TargetRunner))
    mode = "graphs" if graphs else "eager"
    prediction = step_prediction(_read(out, "step"), mode)
    result: dict[str, Any] = {
        "mode": mode,
        "draft": describe(draft_model),
        "target": describe(target_model),
        "device": device,
        "dtype": dtype,
        "gamma": GAMMA,
        "alpha": ALPHA,
        "context": context,
        "points": [],
    }
    for n in (1, 2, 4):
        point = run_point(draft, target, n, GAMMA, ALPHA, context, rounds, prediction, mode=mode)
        result["points"].append(point_dict(point))
        _progress(
            f"  star N={n}: {point.tokens_per_s:.1f} tok/s, alone {point.alone_tokens_per_s:.1f}, "
            f"x{point.speedup:.2f}, model x{point.measured_over_model:.3f} ({point.prediction_from})"
        )
        _write(out, "star", result)
    return result


# --- the starsd local smoke ---------------------------------------------------------------------------------


async def _complete_all(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import aiohttp

    async def one(session: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {text[:300]}")
            return dict(json.loads(text))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        return list(await asyncio.gather(*(one(session, b) for b in bodies)))


def smoke(out: Path, small: bool) -> dict[str, Any]:
    import torch

    from starsd.checkpoints import load_checkpoint
    from starsd.local import LocalStar
    from starsd.tiny import shipped_pair

    device = "cuda" if _cuda() else "cpu"
    pair = shipped_pair()
    tokens = 16 if small else 32
    reference = load_checkpoint(pair.target, device, "float32")
    tokenizer = reference.tokenizer
    bodies = [{"prompt": p, "max_tokens": tokens, "temperature": 0} for p in PROMPTS]
    expected = []
    with torch.inference_mode():
        for p in PROMPTS:
            ids = tokenizer.encode(p)
            generated = reference.model.generate(
                torch.tensor([ids], device=reference.device),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=reference.device),
                max_new_tokens=tokens,
                do_sample=False,
                eos_token_id=reference.eos_token_id,
                pad_token_id=reference.eos_token_id if reference.eos_token_id is not None else 0,
            )[0, len(ids) :].tolist()
            eos = reference.eos_token_id
            generated = generated[: generated.index(eos)] if eos in generated else generated
            expected.append(tokenizer.decode(generated, skip_special_tokens=True))
    del reference
    started = time.perf_counter()
    with LocalStar(pair.draft, pair.target, targets=1, device=device, dtype="float32", log_dir=out / "smoke-logs") as s:
        ready = time.perf_counter() - started
        begin = time.perf_counter()
        outs = asyncio.run(_complete_all(s.urls[0], bodies))
        seconds = time.perf_counter() - begin
    texts = [o["choices"][0]["text"] for o in outs]
    identical = [a == b for a, b in zip(texts, expected, strict=True)]
    return {
        "device": device,
        "dtype": "float32",
        "completions": len(bodies),
        "identical": sum(identical),
        "mismatches": [
            {"prompt": p, "star": t, "target_alone": e}
            for p, t, e, same in zip(PROMPTS, texts, expected, identical, strict=True)
            if not same
        ],
        "drafted_tokens": sum(o["starsd"]["drafted_tokens"] for o in outs),
        "accepted_tokens": sum(o["starsd"]["accepted_tokens"] for o in outs),
        "fallback_tokens": sum(o["starsd"]["fallback_tokens"] for o in outs),
        "start_seconds": round(ready, 2),
        "seconds": round(seconds, 3),
        "passed": all(identical) and sum(o["starsd"]["drafted_tokens"] for o in outs) > 0,
    }


# --- the profile and the goals ------------------------------------------------------------------------------


def profile(out: Path, small: bool) -> dict[str, Any]:
    """The measured profile (``profile.json``, ready for starsd/bench/measured/) and ``summary.json``."""
    from starsd import system_model
    from starsd.bench.profiles import Profile

    pre, corr, st, sr, sm = (_read(out, n) for n in ("preflight", "correctness", "step", "star", "smoke"))
    summary: dict[str, Any] = {"stages": {n: _read(out, n) is not None for n in STAGES[:-1]}}
    if corr:
        summary["correctness_passed"] = bool(corr.get("passed"))
    if sm:
        summary["smoke_passed"] = bool(sm.get("passed"))
    if not st:
        _write(out, "summary", summary)
        return summary
    modes = sorted({r["mode"] for r in st["rows"]})
    hardware = st.get("hardware", "?")
    weights = _weight_bytes(st["plan"]["target"])
    bandwidth = (pre or {}).get("copy", {}).get("read_write_bytes_per_s")
    goals: dict[str, Any] = {}
    for mode in modes:
        pred = step_prediction(st, mode)
        if pred is None:
            continue
        curve, tp = pred
        entry: dict[str, Any] = {"tq_ms": round(curve.tq(1) * 1e3, 4), "tp_ms": round(tp * 1e3, 4)}
        entry["tq_below_tp"] = curve.tq(1) < tp
        entry["n_star"] = system_model.optimal_targets(curve.tq(1), tp, 0.0)
        entry["batched_n_star"] = system_model.batched_optimal_targets(curve, tp, 0.0)
        entry.update(device_figures(st, mode))
        if weights and bandwidth:
            floor = weights / bandwidth
            entry["tp_memory_floor_ms"] = round(floor * 1e3, 4)
            entry["tp_over_floor"] = round(tp / floor, 3)
            entry["tp_within_1_5x_floor"] = tp <= 1.5 * floor
        goals[mode] = entry
    summary["step_goals"] = goals
    if sr and sr["points"]:
        four = next((p for p in sr["points"] if p["targets"] == 4), None)
        if four:
            summary["star_4"] = {
                "speedup": four["speedup"],
                "speedup_at_least_1_8": four["speedup"] >= 1.8,
                "measured_over_model": four["measured_over_model"],
                "within_10_percent_of_model": abs(four["measured_over_model"] - 1) <= 0.1,
            }
    best = "graphs" if "graphs" in goals else "eager"
    pred = step_prediction(st, best)
    if pred is not None:
        curve, tp = pred
        tp1 = next((p["tp1_ms"] / 1e3 for p in (sr or {}).get("points", []) if p["targets"] == 1), None)
        date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        slug = hardware.lower().replace("nvidia ", "").replace(" ", "-")
        p = Profile(
            name=f"{slug}-measured" if not small else "cpu-tiny-measured",
            draft=f"{st['plan']['draft']} shape, random weights, {st['dtype']}",
            target=f"{st['plan']['target']} shape, random weights, {st['dtype']}",
            hardware=f"{hardware}, one device, batch 1 target, {CONTEXT if not small else 32}-token context",
            gamma=GAMMA,
            tq=round(curve.tq(1), 7),
            tp=round(tp, 7),
            tc=0.0001,
            alpha=ALPHA,
            tp1=round(tp1 if tp1 else tp, 7),
            kind="measured",
            source=f"bench/gpu/run.sh on {hardware}, {date} (torch {st.get('torch_version')}; "
            f"starsd bench step, {best} steps; raw results in bench/gpu/results/)",
            derivation=(
                f"Tq(B) = median wall time of one DraftRunner.propose_batch of B sessions, {GAMMA} greedy tokens each; "
                f"Tp = one TargetRunner.step verifying {GAMMA} drafts of one session; "
                + ("Tp1 = the in-process star's median decode step. " if tp1 else "Tp1 = Tp (no star stage ran). ")
                + "Random weights: alpha = 0.7 and Tc = 0.1 ms are given, not measured."
            ),
            batch_curve=tuple((b, round(t, 7)) for b, t in curve.points),
        )
        _write(out, "profile", p.to_dict())
        summary["profile"] = p.name
    _write(out, "summary", summary)
    return summary


def _weight_bytes(model: str) -> float | None:
    """Bytes of a random-weight shape's parameters in bf16 (what one memory-bound step reads)."""
    from starsd.bench.measure_gpu import SHAPES

    if model not in SHAPES:
        return None
    hidden, inter, layers, heads, kv, vocab = SHAPES[model]
    head_dim = hidden // heads
    per_layer = hidden * (hidden + 2 * kv * head_dim) + hidden * hidden + 3 * hidden * inter + 2 * hidden
    untied = model != "llama-1b"
    return 2.0 * (layers * per_layer + vocab * hidden * (2 if untied else 1) + hidden)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m starsd.bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--out", type=Path, required=True, help="the results folder")
    parser.add_argument("--small", action="store_true", help="the CPU path: tiny shapes, seconds")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the step table (then partial)")
    args = parser.parse_args(argv)
    # A stage cut off by its time limit (SIGTERM) unwinds: a local star stops its servers, a test run is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "preflight": lambda: preflight(args.out, args.small),
        "correctness": lambda: correctness(args.out, args.small),
        "step": lambda: step(args.out, args.small, args.budget),
        "star": lambda: star(args.out, args.small),
        "smoke": lambda: smoke(args.out, args.small),
        "profile": lambda: profile(args.out, args.small),
    }
    started = time.perf_counter()
    data = runs[args.stage]()
    data["stage_seconds"] = round(time.perf_counter() - started, 2)
    if args.stage != "profile":
        _write(args.out, args.stage, data)
    print(json.dumps({k: v for k, v in data.items() if not isinstance(v, dict | list)}, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
