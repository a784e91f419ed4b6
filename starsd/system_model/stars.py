"""A star of stars: ``D`` drafts, each feeding its share of the targets, and the best ``(D, N)`` for a number
of accelerators (``starsd plan --gpus``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Unpack

from starsd.system_model.checks import check_cost, check_count, rounded
from starsd.system_model.inputs import Given, StarInputs
from starsd.system_model.one_draft import Regime


def star_capacity(drafts: int, n_star: int) -> int:
    """The targets ``drafts`` drafts keep busy: ``D * N*`` (each draft saturates at its own ``N*``)."""
    check_count("drafts", drafts, 1)
    check_count("n_star", n_star, 1)
    return drafts * n_star


def split_targets(targets: int, drafts: int) -> list[int]:
    """How ``targets`` targets spread over ``drafts`` drafts: as evenly as possible (the assignment's balance,
    :mod:`starsd.assignment`), the larger shares first."""
    check_count("targets", targets, 0)
    check_count("drafts", drafts, 1)
    q, r = divmod(targets, drafts)
    return [q + 1] * r + [q] * (drafts - r)


@dataclass(frozen=True)
class Costs:
    """The price of one accelerator running a draft and of one running a target (any unit, both > 0)."""

    draft: float = 1.0
    target: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "draft", check_cost("draft_cost", self.draft))
        object.__setattr__(self, "target", check_cost("target_cost", self.target))


@dataclass(frozen=True)
class StarOption:
    """``drafts`` drafts and ``targets`` targets (one accelerator each) and what the model says of them."""

    drafts: int
    targets: int
    gpus: int  # drafts + targets
    throughput: float  # tokens/s, every target together
    cost: float  # drafts * draft_cost + targets * target_cost
    throughput_per_cost: float
    targets_per_draft: float
    utilization: float  # the busiest draft's
    regime: Regime  # the busiest draft's

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["regime"] = str(self.regime)
        return d


@dataclass(frozen=True)
class StarPlan:
    """The best ``(D, N)`` for ``gpus`` accelerators: by throughput and by throughput per cost; ``by_drafts``
    holds, for each ``D``, its best ``N`` by throughput."""

    gpus: int
    draft_cost: float
    target_cost: float
    optimal_targets: int  # one draft's N*
    best_throughput: StarOption
    best_per_cost: StarOption
    by_drafts: tuple[StarOption, ...]

    def to_dict(self) -> dict[str, Any]:
        """The fields in order, each option through :meth:`StarOption.to_dict` (its regime as a string)."""
        best = {"best_throughput": self.best_throughput.to_dict(), "best_per_cost": self.best_per_cost.to_dict()}
        return {**asdict(self), **best, "by_drafts": [o.to_dict() for o in self.by_drafts]}


def star_throughput_for(inputs: StarInputs, drafts: int, targets: int) -> float:
    """Tokens per second of ``targets`` targets spread evenly over ``drafts`` drafts: the sum of each draft's
    ``O(n_i)`` (drafts share nothing; a draft with no target adds nothing)."""
    return sum(inputs.point(n).throughput for n in split_targets(targets, drafts) if n > 0)


def star_option_for(inputs: StarInputs, drafts: int, targets: int, costs: Costs) -> StarOption:
    """The model's view of ``drafts`` drafts and ``targets`` targets, the targets spread evenly."""
    check_count("drafts", drafts, 1)
    check_count("targets", targets, 1)
    busiest = inputs.point(split_targets(targets, drafts)[0])
    out = star_throughput_for(inputs, drafts, targets)
    cost = drafts * costs.draft + targets * costs.target
    return StarOption(
        drafts=drafts,
        targets=targets,
        gpus=drafts + targets,
        throughput=out,
        cost=cost,
        throughput_per_cost=out / cost,
        targets_per_draft=targets / drafts,
        utilization=busiest.utilization,
        regime=busiest.regime,
    )


def best_star_for(inputs: StarInputs, gpus: int, costs: Costs) -> StarPlan:
    """The best ``(D, N)`` with ``D + N <= gpus`` (``D, N >= 1``; a draft or a target takes one accelerator,
    priced as ``costs`` says).

    * **By throughput**: the most tokens/s; on a tie (targets past ``D * N*`` only queue) the cheaper, then
      the one with fewer drafts. With equal costs this fills the accelerators so that no draft idles and no
      target queues: about ``D = G / (N* + 1)`` drafts of ``N*`` targets each.
    * **By throughput per cost**: the most tokens/s per unit of cost, among every option that fits in
      ``gpus``; on a tie the one with more throughput, then fewer drafts. A cheap draft accelerator moves it
      towards more drafts (fewer targets each, none of them queueing).
    """
    check_count("gpus", gpus, 2)
    options = [star_option_for(inputs, d, n, costs) for d in range(1, gpus) for n in range(1, gpus - d + 1)]

    def by_throughput(o: StarOption) -> tuple[float, float, int]:
        return (rounded(o.throughput), -o.cost, -o.drafts)

    def by_per_cost(o: StarOption) -> tuple[float, float, int]:
        return (rounded(o.throughput_per_cost), rounded(o.throughput), -o.drafts)

    per_d: dict[int, StarOption] = {}
    for o in options:
        if o.drafts not in per_d or by_throughput(o) > by_throughput(per_d[o.drafts]):
            per_d[o.drafts] = o
    return StarPlan(
        gpus=gpus,
        draft_cost=costs.draft,
        target_cost=costs.target,
        optimal_targets=inputs.optimal_targets,
        best_throughput=max(options, key=by_throughput),
        best_per_cost=max(options, key=by_per_cost),
        by_drafts=tuple(per_d[d] for d in sorted(per_d)),
    )


# The same, with the inputs given one by one.


class Priced(Given, total=False):
    """:class:`StarInputs`' keywords and the prices of :class:`Costs` (each 1.0 when not given)."""

    draft_cost: float
    target_cost: float


def _split(given: Priced) -> tuple[Given, Costs]:
    """The model's keywords and the costs, apart."""
    costs = Costs(given.pop("draft_cost", 1.0), given.pop("target_cost", 1.0))
    return given, costs


def star_throughput(
    drafts: int, targets: int, tq: float, tp: float, tc: float, gamma: int, **given: Unpack[Given]
) -> float:
    """:func:`star_throughput_for` these inputs."""
    return star_throughput_for(StarInputs(tq, tp, tc, gamma, **given), drafts, targets)


def star_option(
    drafts: int, targets: int, tq: float, tp: float, tc: float, gamma: int, **given: Unpack[Priced]
) -> StarOption:
    """:func:`star_option_for` these inputs."""
    model, costs = _split(given)
    return star_option_for(StarInputs(tq, tp, tc, gamma, **model), drafts, targets, costs)


def best_star(gpus: int, tq: float, tp: float, tc: float, gamma: int, **given: Unpack[Priced]) -> StarPlan:
    """:func:`best_star_for` these inputs."""
    model, costs = _split(given)
    return best_star_for(StarInputs(tq, tp, tc, gamma, **model), gpus, costs)
