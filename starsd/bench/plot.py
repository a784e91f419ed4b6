"""The star benchmark's figure: throughput and draft utilisation against N, measured and model, baselines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starsd.bench.analysis import ModelInputs
    from starsd.bench.star import StarReport


def plot_star(report: StarReport, inputs: ModelInputs, path: Path) -> None:
    """Write a PNG: left, tokens/s (measured, the model's O(N), N pairs, target-only); right, utilisation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, mi, p = report.results, report.model_inputs, report.config.profile
    ns = [r.n for r in results]
    dense = list(range(1, max(ns) + 1))
    points = [inputs.point(n) for n in dense]
    pair = next(r for r in results if r.n == 1).throughput
    batched = inputs.max_batch > 1 and inputs.curve is not None

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    label = f"model O(N), batches up to {inputs.max_batch}" if batched else "model O(N)"
    ax1.plot(dense, [pt[0] for pt in points], "-", color="tab:blue", label=label)
    ax1.plot(ns, [r.throughput for r in results], "o", color="tab:blue", label="star, measured")
    ax1.plot(dense, [n * pair for n in dense], ":", color="tab:green", label="N independent pairs (N drafts)")
    ax1.plot(dense, [n / p.tp1 for n in dense], "--", color="tab:gray", label="target-only decoding")
    capacity = mi.expected_tokens_per_round / mi.tq
    ax1.axhline(capacity, color="tab:blue", lw=0.8, ls=(0, (1, 3)), label="capacity of a one-at-a-time draft")
    ax1.set_xlabel("targets N")
    ax1.set_ylabel("tokens/s (all targets)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.axvline(mi.optimal_targets, color="tab:red", lw=0.8, ls="-.", label=f"N* = {mi.optimal_targets}")
    ax1.set_title("throughput (one draft)")
    ax1.legend(fontsize=8)
    ax1.grid(True, which="both", alpha=0.3)

    ax2.plot(dense, [pt[1] * 100 for pt in points], "-", color="tab:orange", label="model utilisation")
    ax2.plot(ns, [r.utilization * 100 for r in results], "o", color="tab:orange", label="draft busy, measured")
    ax2.plot(ns, [r.idle_fraction * 100 for r in results], "x", color="tab:purple", label="idle fraction")
    ax2.axvline(mi.optimal_targets, color="tab:red", lw=0.8, ls="-.")
    ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, 105)
    ax2.set_xlabel("targets N")
    ax2.set_ylabel("%")
    ax2.set_title("draft utilisation")
    ax2.legend(fontsize=8)
    ax2.grid(True, which="both", alpha=0.3)

    fig.suptitle(
        f"StarSD star benchmark: {p.name} (Tq={mi.tq * 1e3:.2f} ms, Tp={mi.tp * 1e3:.2f} ms, "
        f"Tc={mi.tc * 1e3:.2f} ms, gamma={mi.gamma}, alpha={mi.alpha})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
