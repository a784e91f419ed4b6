"""Accelerator profiles: the times of a draft/target pair on given hardware, for the model and the benchmark.

A profile holds what the system model needs (``tq``, ``tp``, ``tc``, ``gamma``, ``alpha``), the target's own
per-token decode time ``tp1`` (the target-only baseline) and, optionally, the draft's batched service times
``Tq(B)``. Every shipped profile names its source and says how its numbers were derived from it; ``kind`` is
``measured`` when the times are read off a published measurement and ``derived`` when they are computed from
published hardware and model figures. Your own profile is a JSON file with the same fields
(``--profile-json FILE``); see :func:`load_profile_json`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from starsd import system_model

KINDS = ("measured", "derived", "user")


@dataclass(frozen=True)
class Profile:
    """One draft/target pair on given hardware (times in seconds)."""

    name: str
    draft: str  # the draft model (and its precision)
    target: str  # the target model (and its precision, parallelism)
    hardware: str
    gamma: int  # draft tokens per round the times below are for
    tq: float  # draft service time of one request: gamma sequential draft steps
    tp: float  # target verify time of one round (gamma + 1 tokens in one pass)
    tc: float  # one-way transfer time between target and draft
    alpha: float  # per-position acceptance probability
    tp1: float  # target-only decoding: seconds per token (the baseline)
    kind: str = "user"
    source: str = ""
    derivation: str = ""
    batch_curve: tuple[tuple[int, float], ...] = field(default_factory=tuple)  # (B, Tq(B)) points

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a profile needs a name")
        if self.kind not in KINDS:
            raise ValueError(f"profile {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        try:
            system_model.cycle_time(self.tq, self.tp, self.tc)
            system_model.expected_tokens_per_round(self.gamma, alpha=self.alpha)
            if isinstance(self.tp1, bool) or not isinstance(self.tp1, int | float) or not self.tp1 > 0:
                raise ValueError(f"tp1 must be > 0 seconds per token, got {self.tp1!r}")
            if not math.isfinite(self.tp1):
                raise ValueError(f"tp1 must be finite, got {self.tp1!r}")
            curve = self.curve()
            if curve is not None and not math.isclose(curve.tq(1), self.tq, rel_tol=1e-6):
                raise ValueError(f"the batch curve's Tq(1)={curve.tq(1)} differs from tq={self.tq}")
        except ValueError as exc:
            raise ValueError(f"profile {self.name}: {exc}") from None

    def curve(self) -> system_model.BatchCurve | None:
        return (
            system_model.BatchCurve(tuple((int(b), float(t)) for b, t in self.batch_curve))
            if self.batch_curve
            else None
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # JSON writes the batch curve's pairs as lists


# --- how the derived numbers are computed ------------------------------------------------------------------

# The bandwidth a well-tuned batch-1 decoder reaches, as a fraction of the datasheet peak: gpt-fast measured
# 1397.31 GB/s for Llama-2-7B bf16 on an A100-80GB (README "Benchmarks"), whose datasheet peak is 2039 GB/s.
ACHIEVED_BANDWIDTH_FRACTION = 1397.31 / 2039.0
H100_SXM_BANDWIDTH = 3.35e12  # bytes/s, HBM3, NVIDIA H100 SXM datasheet


def memory_bound_step(weight_bytes: float, kv_bytes_per_sequence: float, bandwidth: float, batch: int) -> float:
    """One decode step of a memory-bound model: read the weights once and each sequence's KV cache.

    This is why a small draft batches almost for free: the weights dominate, and they are read once per step
    whatever the batch size; only the KV term grows with ``batch``.
    """
    if weight_bytes <= 0 or kv_bytes_per_sequence < 0 or bandwidth <= 0 or batch < 1:
        raise ValueError("weights and bandwidth must be > 0, KV bytes >= 0, batch >= 1")
    return (weight_bytes + batch * kv_bytes_per_sequence) / bandwidth


def _llama32_1b_on_h100(gamma: int, context: int, batches: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
    # Llama-3.2-1B: 1.236e9 parameters in bf16; 16 layers x 8 KV heads x 64 dims x (K, V) x 2 bytes per token.
    weights = 1.236e9 * 2
    kv_per_token = 16 * 8 * 64 * 2 * 2
    bw = H100_SXM_BANDWIDTH * ACHIEVED_BANDWIDTH_FRACTION
    return tuple((b, round(gamma * memory_bound_step(weights, kv_per_token * context, bw, b), 7)) for b in batches)


def _llama31_70b_tp4_on_h100() -> float:
    # Llama-3.1-70B: 70.6e9 parameters in bf16, split over 4 GPUs (tensor parallel): each reads a quarter.
    bw = H100_SXM_BANDWIDTH * ACHIEVED_BANDWIDTH_FRACTION
    return round(memory_bound_step(70.6e9 * 2 / 4, 0.0, bw, 1), 7)


_H100_CURVE = _llama32_1b_on_h100(gamma=4, context=1024, batches=(1, 2, 4, 8, 16, 32))

# One-way transfer between hosts in one data centre: 0.1 ms, the packet delay gRPC's Java benchmarks emulate
# for a 10 Gbit/s Ethernet link (grpc-java, benchmarks/README.md); our messages are a few hundred bytes.
DATACENTRE_TC = 0.0001

PROFILES: tuple[Profile, ...] = (
    Profile(
        name="tpuv4-chinchilla70b-4b",
        draft="4B-parameter Chinchilla-style draft",
        target="Chinchilla 70B",
        hardware="TPU v4 (16 chips per model, as in the paper)",
        gamma=4,
        tq=0.0072,
        tp=0.0141,
        tc=DATACENTRE_TC,
        alpha=0.711,
        tp1=0.0141,
        kind="measured",
        source=(
            "Chen et al. 2023, 'Accelerating Large Language Model Decoding with Speculative Sampling', "
            "arXiv:2302.01318: section 4 (draft 1.8 ms per token, Chinchilla 70B 14.1 ms per token) and "
            "Table 1 (speculative sampling with K=4 on XSum: 7.52 ms per token)."
        ),
        derivation=(
            "Tq = K x 1.8 ms = 7.2 ms (K sequential draft steps). Tp = Tp1 = 14.1 ms: verifying K+1 tokens is "
            "taken to cost one target step (memory-bound), a lower bound. alpha solves "
            "(1 - a^5)/(1 - a) = (Tq + Tp)/7.52 ms = 2.83, so a = 0.711 (a lower bound, like Tp; HumanEval's "
            "5.73 ms per token would give 0.851). Tc: the paper co-locates the models; for a star across hosts, "
            "0.1 ms one way (see DATACENTRE_TC)."
        ),
    ),
    Profile(
        name="a100-llama2-70b-int4_7b-int4",
        draft="Llama-2-7B, int4 weights (group size 32)",
        target="Llama-2-70B, int4 weights (group size 32)",
        hardware="NVIDIA A100-80GB (power-limited to 330 W), one per model, batch 1",
        gamma=5,
        tq=round(5 / 196.80, 7),
        tp=round(1 / 25.25, 7),
        tc=DATACENTRE_TC,
        alpha=0.730,
        tp1=round(1 / 25.25, 7),
        kind="measured",
        source=(
            "gpt-fast (github.com/pytorch-labs/gpt-fast) README, 'Benchmarks': Llama-2-7B 4-bit 196.80 tok/s, "
            "Llama-2-70B 4-bit 25.25 tok/s; 'Speculative Sampling': verifier Llama-70B int4 with draft "
            "Llama-7B int4, 48.4 tok/s."
        ),
        derivation=(
            "Tq = 5 / 196.80 tok/s = 25.4 ms (speculate_k = 5, as in the repository's speculate_* scripts). "
            "Tp = Tp1 = 1 / 25.25 tok/s = 39.6 ms (one target step, a lower bound). alpha solves "
            "(1 - a^6)/(1 - a) = 48.4 tok/s x (Tq + Tp) = 3.15, so a = 0.730. A 7B draft is slow (Tq is almost "
            "two thirds of Tp), so a few targets fill it, which is why a star wants a much smaller draft."
        ),
    ),
    Profile(
        name="h100-llama3.1-70b-tp4_llama3.2-1b",
        draft="Llama-3.2-1B, bf16",
        target="Llama-3.1-70B, bf16, tensor parallel over 4 GPUs",
        hardware="NVIDIA H100 SXM (1 for the draft, 4 per target), batch 1, 1024-token context",
        gamma=4,
        tq=_H100_CURVE[0][1],
        tp=_llama31_70b_tp4_on_h100(),
        tc=DATACENTRE_TC,
        alpha=0.7,
        tp1=_llama31_70b_tp4_on_h100(),
        kind="derived",
        source=(
            "NVIDIA H100 SXM datasheet (3.35 TB/s HBM3); Meta's model cards (Llama-3.2-1B: 1.24B parameters, "
            "16 layers, 8 KV heads of 64; Llama-3.1-70B: 70.6B parameters); gpt-fast README (1397.31 GB/s "
            "reached at batch 1 on an A100-80GB, 2039 GB/s peak)."
        ),
        derivation=(
            "Decoding at batch 1 is memory-bound: a step reads the weights (and each sequence's KV cache) once. "
            "Achieved bandwidth = 3.35 TB/s x 1397.31/2039 = 2.30 TB/s. Draft step = (2.47 GB + B x 32 MiB of "
            "KV at 1024 tokens) / 2.30 TB/s; Tq(B) = 4 steps: 4.37 ms at B=1, 4.77 ms at B=8, 6.18 ms at B=32 "
            "(the batch curve: memory-bound, so it grows slowly). Tp = Tp1 = 141 GB / 4 GPUs / 2.30 TB/s = "
            "15.4 ms (the same rule gives 25.2 ms for gpt-fast's 70B on 4 A100s, which measured 26.3 ms). "
            "alpha = 0.7 is an assumption (no published acceptance for this pair was at hand): override it."
        ),
        batch_curve=_H100_CURVE,
    ),
)

DEFAULT_PROFILE = "tpuv4-chinchilla70b-4b"


def names() -> list[str]:
    return [p.name for p in PROFILES]


def get(name: str) -> Profile:
    """The shipped profile called ``name`` (ValueError listing the known names otherwise)."""
    for p in PROFILES:
        if p.name == name:
            return p
    raise ValueError(f"unknown profile {name!r}; known profiles: {', '.join(names())}")


_REQUIRED = ("name", "gamma", "tq", "tp", "tc", "alpha")


def profile_from_dict(data: dict[str, Any]) -> Profile:
    """Build a profile from JSON-like data: ``name, gamma, tq, tp, tc, alpha`` are required; ``tp1`` defaults
    to ``tp``; ``draft, target, hardware, source, derivation`` are free text; ``batch_curve`` is a list of
    ``[B, seconds]`` pairs starting at B=1."""
    if not isinstance(data, dict):
        raise ValueError("a profile must be a JSON object")
    known = {f.name for f in fields(Profile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown profile fields: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"the profile lacks {', '.join(missing)}")
    values = dict(data)
    values.setdefault("tp1", values["tp"])
    values.setdefault("kind", "user")
    for text in ("draft", "target", "hardware", "source", "derivation"):
        values.setdefault(text, "")
    curve = values.get("batch_curve") or []
    try:
        values["batch_curve"] = tuple((int(b), float(t)) for b, t in curve)
    except (TypeError, ValueError):
        raise ValueError("batch_curve must be a list of [B, seconds] pairs") from None
    return Profile(**values)


def load_profile_json(path: str | Path) -> Profile:
    """Read a profile of your own from a JSON file (one object; see :func:`profile_from_dict`)."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return profile_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def describe(p: Profile) -> str:
    """A few lines for ``starsd bench profiles``."""
    n_star = system_model.optimal_targets(p.tq, p.tp, p.tc)
    lines = [
        f"{p.name}  [{p.kind}]",
        f"  draft {p.draft} | target {p.target} | {p.hardware}",
        f"  gamma={p.gamma}  Tq={p.tq * 1e3:.3f} ms  Tp={p.tp * 1e3:.3f} ms  Tc={p.tc * 1e3:.3f} ms  "
        f"alpha={p.alpha}  Tp1={p.tp1 * 1e3:.3f} ms/token  N*={n_star}",
    ]
    curve = p.curve()
    if curve is not None:
        pts = ", ".join(f"{b}:{t * 1e3:.2f}" for b, t in curve.points)
        lines.append(f"  Tq(B) ms: {pts}  (batched N*={system_model.batched_optimal_targets(curve, p.tp, p.tc)})")
    lines.append(f"  source: {p.source}")
    lines.append(f"  derivation: {p.derivation} {n_star_derivation(p)}")
    return "\n".join(lines)


def n_star_derivation(p: Profile) -> str:
    """How ``N*`` follows from the profile's times, computed (never written by hand, so it cannot disagree
    with the ``N*=`` of the header)."""
    n_star = system_model.optimal_targets(p.tq, p.tp, p.tc)
    return (
        f"N* = ceil(1 + (Tp + 2 Tc) / Tq) = ceil(1 + ({p.tp * 1e3:.3f} + {2 * p.tc * 1e3:.3f}) / "
        f"{p.tq * 1e3:.3f}) = {n_star}."
    )


# Profiles measured by StarSD itself on real hardware (bench/gpu/run.sh writes one as profile.json): one JSON file
# each, shipped with the package. A file dropped here appears in `starsd bench profiles` and is usable by name.
MEASURED_DIR = Path(__file__).with_name("measured")


def measured_profiles(directory: Path = MEASURED_DIR) -> tuple[Profile, ...]:
    """The profiles in ``directory`` (``*.json``, by file name), each a measurement: kind ``measured`` and a
    source are required, so that a profile never appears without saying where its numbers come from."""
    found = []
    for path in sorted(directory.glob("*.json")):
        p = load_profile_json(path)
        if p.kind != "measured" or not p.source:
            raise ValueError(f"{path}: a shipped measured profile needs kind 'measured' and a source")
        found.append(p)
    return tuple(found)


PROFILES = PROFILES + measured_profiles()
