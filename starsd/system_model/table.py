"""The plan of one draft: the model's row for each ``N`` (``starsd plan``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Unpack

from starsd.system_model.inputs import Given, StarInputs
from starsd.system_model.one_draft import Regime


@dataclass(frozen=True)
class PlanRow:
    """The model's prediction for ``n`` targets on one draft."""

    n: int
    regime: Regime
    utilization: float  # draft busy fraction
    throughput: float  # tokens/s, all targets together: O(N)
    per_target_throughput: float  # tokens/s of one target
    latency_per_token: float  # seconds per committed token seen by one target
    round_time: float  # seconds per round of one target, queueing included
    batch: int  # requests per draft pass (1 without a batch curve)
    optimal: bool  # n == N*

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regime"] = str(self.regime)
        return d


def plan_table(inputs: StarInputs, ns: Sequence[int] | None = None) -> list[PlanRow]:
    """The model's table over ``ns`` (default ``1..max(8, 2*N*)``), marking ``N*`` (the batched one when the
    draft batches)."""
    n_star = inputs.optimal_targets
    tokens = inputs.tokens_per_round
    rows: list[PlanRow] = []
    for n in ns if ns is not None else range(1, max(8, 2 * n_star) + 1):
        p = inputs.point(n)
        rows.append(
            PlanRow(
                n=n,
                regime=p.regime,
                utilization=p.utilization,
                throughput=p.throughput,
                per_target_throughput=tokens / p.round_time,
                latency_per_token=p.round_time / tokens,
                round_time=p.round_time,
                batch=p.batch,
                optimal=n == n_star,
            )
        )
    return rows


def plan(
    tq: float, tp: float, tc: float, gamma: int, *, ns: Sequence[int] | None = None, **given: Unpack[Given]
) -> list[PlanRow]:
    """:func:`plan_table` of these inputs; with ``batch_curve``, ``tq`` must equal its ``Tq(1)``."""
    return plan_table(StarInputs(tq, tp, tc, gamma, **given), ns)
