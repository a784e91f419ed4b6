"""The split of the total target count across pools: weights, bounds, totals, and no pool ever shrinks when
the total grows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starsd_operator.pools import capacity, split
from starsd_operator.spec import PoolSpec


def pool(name: str, weight: int = 1, lo: int = 0, hi: int = 64) -> PoolSpec:
    return PoolSpec(name=name, weight=weight, min_replicas=lo, max_replicas=hi)


@st.composite
def pool_lists(draw: st.DrawFn) -> list[PoolSpec]:
    n = draw(st.integers(1, 5))
    pools = []
    for i in range(n):
        lo = draw(st.integers(0, 4))
        hi = draw(st.integers(lo, 12))
        pools.append(pool(f"p{i}", draw(st.integers(0, 5)), lo, hi))
    return pools


def test_weights_two_to_one() -> None:
    assert split(3, [pool("a", 2), pool("b", 1)]) == {"a": 2, "b": 1}
    assert split(6, [pool("a", 2), pool("b", 1)]) == {"a": 4, "b": 2}
    assert split(9, [pool("a", 2), pool("b", 1)]) == {"a": 6, "b": 3}


def test_equal_weights_split_evenly_and_ties_go_to_the_first_pool() -> None:
    assert split(4, [pool("a"), pool("b")]) == {"a": 2, "b": 2}
    assert split(5, [pool("a"), pool("b")]) == {"a": 3, "b": 2}


def test_minimums_count_towards_the_share() -> None:
    # b must run 2; the remaining 2 go to a, which is then at its 2:2 share of 4.
    assert split(4, [pool("a", 1), pool("b", 1, lo=2)]) == {"a": 2, "b": 2}


def test_a_full_pool_overflows_into_the_others() -> None:
    assert split(10, [pool("a", 5, hi=2), pool("b", 1)]) == {"a": 2, "b": 8}


def test_below_the_minimums_every_pool_keeps_its_minimum() -> None:
    assert split(1, [pool("a", lo=2), pool("b", lo=1)]) == {"a": 2, "b": 1}


def test_above_the_maximums_every_pool_sits_at_its_maximum() -> None:
    assert split(100, [pool("a", hi=3), pool("b", hi=4)]) == {"a": 3, "b": 4}


def test_zero_weight_pools_only_take_the_overflow() -> None:
    assert split(3, [pool("a", 1, hi=2), pool("b", 0)]) == {"a": 2, "b": 1}
    assert split(2, [pool("a", 1, hi=2), pool("b", 0)]) == {"a": 2, "b": 0}


def test_all_zero_weights_count_as_equal() -> None:
    assert split(4, [pool("a", 0), pool("b", 0)]) == {"a": 2, "b": 2}


def test_zero_targets() -> None:
    assert split(0, [pool("a"), pool("b")]) == {"a": 0, "b": 0}


def test_negative_totals_are_refused() -> None:
    with pytest.raises(ValueError):
        split(-1, [pool("a")])


def test_capacity_sums_the_bounds() -> None:
    assert capacity([pool("a", lo=1, hi=3), pool("b", lo=0, hi=4)]) == (1, 7)


@given(pool_lists(), st.integers(0, 80))
def test_every_pool_stays_within_its_bounds(pools: list[PoolSpec], total: int) -> None:
    result = split(total, pools)
    assert list(result) == [p.name for p in pools]
    for p in pools:
        assert p.min_replicas <= result[p.name] <= p.max_replicas


@given(pool_lists(), st.integers(0, 80))
def test_the_total_is_kept_whenever_the_bounds_allow(pools: list[PoolSpec], total: int) -> None:
    lo, hi = capacity(pools)
    assert sum(split(total, pools).values()) == min(max(total, lo), hi)


@given(pool_lists(), st.integers(0, 80))
def test_raising_the_total_never_shrinks_a_pool(pools: list[PoolSpec], total: int) -> None:
    before, after = split(total, pools), split(total + 1, pools)
    assert all(after[name] >= before[name] for name in before)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 60))
def test_two_unbounded_pools_are_within_one_of_their_exact_share(wa: int, wb: int, total: int) -> None:
    result = split(total, [pool("a", wa, hi=1000), pool("b", wb, hi=1000)])
    assert abs(result["a"] - total * wa / (wa + wb)) < 1
    assert abs(result["b"] - total * wb / (wa + wb)) < 1
