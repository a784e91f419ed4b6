"""The demo: a local star on the shipped models, one workload run twice (with the draft, then targets alone)."""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from starsd.local import LocalStar, http_json

# Prompts in the style of the shipped models' training text (Python sources).
DEMO_PROMPTS = [
    "def __init__(self, ",
    "import os\nimport sys\n\n",
    "class Config:\n    def __init__(self",
    "    for key, value in ",
    "def main(argv=None):\n    ",
    "    if not isinstance(",
    "    raise TypeError(",
    "try:\n    from ",
    "    def __repr__(self):\n        return ",
    "    with open(filename",
    "def _check_",
    "    return self.",
    "    @property\n    def ",
    "        except OSError:\n",
    "if __name__ == '__main__':\n    ",
    "    def close(self):\n",
]


@dataclass
class TargetTotals:
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    fallback: int = 0
    requests: int = 0
    seconds: float = 0.0  # the sum of this target's request latencies

    @property
    def ms_per_request(self) -> float:
        return 1e3 * self.seconds / self.requests if self.requests else 0.0

    @property
    def ms_per_token(self) -> float:
        """Time per output token (TPOT) of this target's completions: their latency over their tokens."""
        return 1e3 * self.seconds / self.tokens if self.tokens else 0.0


@dataclass
class PhaseResult:
    seconds: float
    per_target: dict[str, TargetTotals]
    outputs: dict[int, list[int]] = field(default_factory=dict)
    failures: int = 0

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.per_target.values())


def run_workload(
    urls: list[str], requests: int, max_tokens: int, concurrency: int, progress: Any | None = None
) -> PhaseResult:
    """Send ``requests`` greedy completions spread over the targets, ``concurrency`` at a time."""

    def one(i: int) -> tuple[int, float, dict[str, Any] | None]:
        url = urls[i % len(urls)]
        body = {"prompt": DEMO_PROMPTS[i % len(DEMO_PROMPTS)], "max_tokens": max_tokens, "temperature": 0}
        sent = time.perf_counter()
        status, out = http_json(f"{url}/v1/completions", body, timeout=300)
        return i, time.perf_counter() - sent, out if status == 200 else None

    per_target: dict[str, TargetTotals] = defaultdict(TargetTotals)
    result = PhaseResult(0.0, per_target)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in as_completed([pool.submit(one, i) for i in range(requests)]):
            i, seconds, out = future.result()
            if progress is not None:
                progress.update(1)
            if out is None:
                result.failures += 1
                continue
            s = out["starsd"]
            totals = per_target[s["target"]]
            totals.tokens += out["usage"]["completion_tokens"]
            totals.drafted += s["drafted_tokens"]
            totals.accepted += s["accepted_tokens"]
            totals.rounds += s["rounds"]
            totals.fallback += s["fallback_tokens"]
            totals.requests += 1
            totals.seconds += seconds
            result.outputs[i] = s["token_ids"]
    result.seconds = time.perf_counter() - start
    return result


def wait_draft_state(star: LocalStar, connected: bool, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [http_json(f"{u}/readyz", timeout=5)[1].get("draft_connected") for u in star.urls]
        if all(s == connected for s in states):
            return
        time.sleep(0.2)


def format_report(star_phase: PhaseResult, alone_phase: PhaseResult, load: dict[str, Any], targets: int) -> str:
    lines = []
    header = (
        f"{'target':<10}{'requests':>9}{'ms/req':>9}{'alone':>9}{'ms/token':>10}{'alone':>8}{'speedup':>9}"
        f"{'accept rate':>12}{'mean accepted':>14}{'rounds':>8}{'fallback':>9}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for name in sorted(star_phase.per_target):
        t = star_phase.per_target[name]
        alone = alone_phase.per_target.get(name, TargetTotals())
        rate = t.accepted / t.drafted if t.drafted else 0.0
        mean_len = t.accepted / t.rounds if t.rounds else 0.0
        speedup = alone.ms_per_token / t.ms_per_token if t.ms_per_token else 0.0
        lines.append(
            f"{name:<10}{t.requests:>9}{t.ms_per_request:>9.0f}{alone.ms_per_request:>9.0f}"
            f"{t.ms_per_token:>10.1f}{alone.ms_per_token:>8.1f}{speedup:>8.2f}x"
            f"{rate:>12.2f}{mean_len:>14.2f}{t.rounds:>8}{t.fallback:>9}"
        )
    total = star_phase.tokens / star_phase.seconds if star_phase.seconds else 0.0
    total_alone = alone_phase.tokens / alone_phase.seconds if alone_phase.seconds else 0.0
    lines.append("-" * len(header))
    lines.append(
        f"all {sum(t.requests for t in star_phase.per_target.values())} requests: {total:.1f} tokens/s with the "
        f"draft, {total_alone:.1f} alone ({(total / total_alone if total_alone else 0):.2f}x), over each "
        "run's wall time"
    )
    lines.append(
        "Acceptance differs between identical targets because their prompts differ: request i goes to target "
        f"i mod {targets} with prompt i mod {len(DEMO_PROMPTS)}, and how often the draft guesses right depends "
        "on the text."
    )
    same = sum(1 for i, ids in star_phase.outputs.items() if alone_phase.outputs.get(i) == ids)
    lines.append("")
    lines.append(
        f"draft: utilisation {load.get('utilization', 0):.0%} over the last {load.get('window_seconds', 0):.0f} s, "
        f"regime {load.get('regime')}, Tq {load.get('tq_seconds', 0) * 1e3:.1f} ms, "
        f"Tp {load.get('tp_seconds', 0) * 1e3:.1f} ms, Tc {load.get('tc_seconds', 0) * 1e3:.2f} ms, "
        f"N* = {load.get('recommended_targets')} (system model)"
    )
    lines.append(read_regime(load, targets))
    lines.append(
        f"lossless: {same}/{len(star_phase.outputs)} greedy completions identical with and without the draft; "
        f"failed requests: {star_phase.failures + alone_phase.failures}"
    )
    lines.append(
        f"note: the draft and all {targets} targets share this machine's CPU cores, so these figures show the "
        "mechanism, not a GPU cluster's speed."
    )
    return "\n".join(lines)


def read_regime(load: dict[str, Any], targets: int) -> str:
    """One sentence that reads the draft's regime line for this run's target count.

    The regime and N* are the system model's verdict on the draft's measured Tq, Tp and Tc (not on its
    measured utilisation, which is lower when targets spend time outside rounds: HTTP, tokenising, gaps
    in the workload).
    """
    n_star = load.get("recommended_targets")
    regime = load.get("regime")
    if not isinstance(n_star, int) or regime not in ("FullyLoaded", "UnderLoaded"):
        return "The draft reported no load (regime and N* unknown)."
    reading = "Reading it: the regime and N* are the system model's, on the measured Tq, Tp and Tc."
    if regime == "FullyLoaded" and targets > n_star:
        return (
            f"{reading} FullyLoaded: {targets} targets ask more of the draft than one round leaves it time for "
            f"(N x Tq >= Tq + Tp + 2 Tc); N* = {n_star} already fill it, so the other {targets - n_star} wait "
            "for it: more targets add latency, not throughput."
        )
    if regime == "FullyLoaded":
        return (
            f"{reading} FullyLoaded: {targets} target(s) leave the draft no idle time in a round; "
            f"N* = {n_star} is the fewest that do, so this star is sized right."
        )
    if targets < n_star:
        return (
            f"{reading} UnderLoaded: with {targets} target(s) the draft idles part of each round; "
            f"N* = {n_star} would fill it, so it has room for {n_star - targets} more."
        )
    return (
        f"{reading} UnderLoaded: fewer than N* = {n_star} targets were connected to the draft when it reported "
        f"(the regime counts connected targets, not the {targets} started)."
    )
