"""The system model of a star with several drafts (starsd.system_model: star_capacity ... best_star)."""

from __future__ import annotations

import itertools

import pytest

from starsd import system_model
from starsd.system_model import BatchCurve, Regime

# N* = ceil(1 + (0.02 + 0.002)/0.004) = 7 and C/tq = 6.5: the seventh target of a draft adds half a target's
# worth of throughput, so the cost of a target decides whether it is worth having.
TIMES = {"tq": 0.004, "tp": 0.02, "tc": 0.001, "gamma": 4, "alpha": 0.8}


def test_capacity_of_d_drafts_is_d_times_n_star() -> None:
    assert system_model.star_capacity(1, 7) == 7
    assert system_model.star_capacity(4, 7) == 28
    with pytest.raises(ValueError, match="drafts"):
        system_model.star_capacity(0, 7)
    with pytest.raises(ValueError, match="n_star"):
        system_model.star_capacity(2, 0)


@pytest.mark.parametrize(("targets", "drafts"), list(itertools.product(range(0, 30), range(1, 6))))
def test_targets_split_evenly(targets: int, drafts: int) -> None:
    shares = system_model.split_targets(targets, drafts)
    assert len(shares) == drafts
    assert sum(shares) == targets
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_d_drafts_at_d_times_n_star_make_d_times_one_draft_at_n_star() -> None:
    one = system_model.throughput(7, **TIMES)
    for d in (1, 2, 4):
        assert system_model.star_throughput(d, 7 * d, **TIMES) == pytest.approx(d * one)
    # Past D*N* targets only queue: throughput stays at D drafts' capacity.
    capacity = system_model.draft_capacity(0.004, 4, alpha=0.8)
    assert system_model.star_throughput(2, 40, **TIMES) == pytest.approx(2 * capacity)
    # A draft with no target adds nothing: 3 targets on 5 drafts make what 3 pairs make.
    assert system_model.star_throughput(5, 3, **TIMES) == pytest.approx(3 * system_model.throughput(1, **TIMES))


def test_star_throughput_with_a_batch_curve_uses_the_batched_model() -> None:
    curve = BatchCurve.parse("1:0.004,8:0.006")
    want = 2 * system_model.batched_throughput(20, curve, 0.02, 0.001, 4, alpha=0.8)
    assert system_model.star_throughput(2, 40, batch_curve=curve, **TIMES) == pytest.approx(want)


def test_option_reports_the_busiest_draft_and_the_cost() -> None:
    o = system_model.star_option(2, 15, draft_cost=3.0, target_cost=2.0, **TIMES)
    assert (o.drafts, o.targets, o.gpus) == (2, 15, 17)
    assert o.cost == pytest.approx(2 * 3.0 + 15 * 2.0)
    assert o.utilization == 1.0 and o.regime is Regime.FULLY_LOADED  # the busier draft has 8 > N* targets
    assert o.throughput_per_cost == pytest.approx(o.throughput / o.cost)
    light = system_model.star_option(3, 6, **TIMES)
    assert light.regime is Regime.UNDER_LOADED
    assert light.utilization == pytest.approx(2 * 0.004 / 0.026)


def _by_hand(drafts: int, targets: int, draft_cost: float, target_cost: float) -> tuple[float, float]:
    """(throughput, throughput per cost) of a star, from DESIGN.md section 2 written out here (no system_model):
    the targets spread evenly over the drafts, each draft's share k committing k * (E[l] + 1) / max(C, k * Tq)."""
    tq, tp, tc, gamma, alpha = TIMES["tq"], TIMES["tp"], TIMES["tc"], int(TIMES["gamma"]), TIMES["alpha"]
    tokens_per_round = sum(alpha**k for k in range(gamma + 1))  # E[l] + 1 with a constant acceptance
    cycle = tq + tp + 2 * tc
    shares = [targets // drafts + (1 if i < targets % drafts else 0) for i in range(drafts)]
    total = sum(k * tokens_per_round / max(cycle, k * tq) for k in shares if k)
    return total, total / (drafts * draft_cost + targets * target_cost)


def _brute_force(gpus: int, draft_cost: float, target_cost: float) -> list[tuple[int, int, float, float]]:
    """Every star within ``gpus`` accelerators: (drafts, targets, throughput, throughput per cost)."""
    return [(d, n, *_by_hand(d, n, draft_cost, target_cost)) for d in range(1, gpus) for n in range(1, gpus - d + 1)]


@pytest.mark.parametrize(("gpus", "draft_cost", "target_cost"), [(16, 1, 1), (16, 10, 1), (16, 1, 10), (9, 0.5, 2)])
def test_best_star_is_the_best_option_within_the_gpus(gpus: int, draft_cost: float, target_cost: float) -> None:
    plan = system_model.best_star(gpus, draft_cost=draft_cost, target_cost=target_cost, **TIMES)
    options = _brute_force(gpus, draft_cost, target_cost)
    assert plan.best_throughput.gpus <= gpus and plan.best_per_cost.gpus <= gpus
    assert plan.best_throughput.throughput == pytest.approx(max(o[2] for o in options))
    assert plan.best_per_cost.throughput_per_cost == pytest.approx(max(o[3] for o in options))
    assert [o.drafts for o in plan.by_drafts] == list(range(1, gpus))
    for row in plan.by_drafts:
        same_d = [o[2] for o in options if o[0] == row.drafts]
        assert row.throughput == pytest.approx(max(same_d))


def test_equal_costs_fill_the_gpus_with_stars_of_n_star() -> None:
    plan = system_model.best_star(16, **TIMES)
    assert plan.optimal_targets == 7
    # Two drafts of N* = 7 targets each, every draft saturated, all 16 accelerators used.
    assert (plan.best_throughput.drafts, plan.best_throughput.targets) == (2, 14)
    # Per unit of cost the seventh target of each draft (half a target's worth) is not worth its accelerator.
    assert (plan.best_per_cost.drafts, plan.best_per_cost.targets) == (2, 12)


def test_the_cost_ratio_moves_the_choice() -> None:
    expensive_drafts = system_model.best_star(16, draft_cost=10, target_cost=1, **TIMES)
    assert (expensive_drafts.best_per_cost.drafts, expensive_drafts.best_per_cost.targets) == (2, 14)
    expensive_targets = system_model.best_star(16, draft_cost=1, target_cost=10, **TIMES)
    assert (expensive_targets.best_per_cost.drafts, expensive_targets.best_per_cost.targets) == (2, 12)


def test_more_gpus_add_drafts() -> None:
    drafts = [system_model.best_star(g, **TIMES).best_throughput.drafts for g in range(2, 34, 2)]
    assert drafts == sorted(drafts)  # never fewer drafts for more accelerators
    assert drafts[0] == 1 and drafts[-1] >= 4
    # C/tq = 6.5 targets keep a draft busy: every draft added once the accelerators hold ~7.5 per draft.
    assert all(abs(d - g / 7.5) < 1 for d, g in zip(drafts, range(2, 34, 2), strict=True))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gpus": 1}, "gpus"),
        ({"gpus": 8, "draft_cost": 0}, "draft_cost"),
        ({"gpus": 8, "target_cost": float("nan")}, "target_cost"),
        ({"gpus": 8, "tq": 0}, "tq"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        system_model.best_star(**{**TIMES, **kwargs})  # type: ignore[arg-type]
