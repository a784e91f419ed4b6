"""The assignment of targets to drafts: balanced for every pool size, stable when a draft is added or removed,
spread evenly when a draft fails, computed from a target's id alone."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from starsd.assignment import HASHED_ORDINALS, first_choices, ordered_drafts, preference, target_ordinal


def spread(choices: tuple[int, ...], drafts: int) -> int:
    held = Counter(choices)
    return max(held[d] for d in range(drafts)) - min(held[d] for d in range(drafts))


@pytest.mark.parametrize("drafts", range(1, 33))
def test_every_pool_size_is_balanced(drafts: int) -> None:
    choices = first_choices(400, drafts)
    worst = max(spread(choices[:n], drafts) for n in range(1, 401))
    assert worst <= (1 if drafts <= 4 else 5), f"{drafts} drafts: loads differ by {worst} targets"


@pytest.mark.parametrize("drafts", range(2, 33))
def test_adding_a_draft_moves_only_the_targets_it_takes(drafts: int) -> None:
    before, after = first_choices(300, drafts - 1), first_choices(300, drafts)
    moved = [i for i in range(300) if before[i] != after[i]]
    assert all(after[i] == drafts - 1 for i in moved), "a target moved between two old drafts"
    assert len(moved) == Counter(after)[drafts - 1]
    assert len(moved) <= math.ceil(300 / drafts) + 1


def test_three_to_four_drafts_moves_at_most_a_third_of_nine_targets() -> None:
    moved = sum(a != b for a, b in zip(first_choices(9, 3), first_choices(9, 4), strict=True))
    assert 0 < moved <= 3
    assert sorted(Counter(first_choices(9, 3)).values()) == [3, 3, 3]


def test_removing_the_newest_draft_sends_back_only_its_own_targets() -> None:
    after, before = first_choices(50, 4), first_choices(50, 5)
    assert [i for i in range(50) if after[i] != before[i]] == [i for i in range(50) if before[i] == 4]


def test_a_pool_that_grows_keeps_the_choices_of_its_existing_targets() -> None:
    assert first_choices(200, 6)[:37] == first_choices(37, 6)


@pytest.mark.parametrize("drafts", [2, 3, 4, 7])
def test_preference_lists_every_draft_once_first_choice_first(drafts: int) -> None:
    for ordinal in range(60):
        order = preference(ordinal, drafts)
        assert sorted(order) == list(range(drafts))
        assert order[0] == first_choices(ordinal + 1, drafts)[ordinal]


@pytest.mark.parametrize("drafts", [3, 4, 6])
def test_the_targets_of_a_failed_draft_spread_over_the_others(drafts: int) -> None:
    targets = 12 * drafts * (drafts - 1)
    for failed in range(drafts):
        second = Counter(preference(i, drafts)[1] for i in range(targets) if preference(i, drafts)[0] == failed)
        assert set(second) == set(range(drafts)) - {failed}
        assert max(second.values()) - min(second.values()) <= 1


def test_ordinal_is_the_trailing_number_or_a_stable_hash() -> None:
    assert target_ordinal("demo-pool-a-3") == 3
    assert target_ordinal("t12") == 12
    assert target_ordinal("my-target") == target_ordinal("my-target") < HASHED_ORDINALS
    assert target_ordinal("my-target") != target_ordinal("your-target")


def test_ordered_drafts_maps_addresses() -> None:
    addresses = [f"d{i}:50051" for i in range(3)]
    assert ordered_drafts("x-0", addresses)[0] == "d0:50051"
    assert ordered_drafts("x-1", addresses)[0] == "d1:50051"
    assert sorted(ordered_drafts("x-5", addresses)) == addresses
    assert ordered_drafts("x-5", []) == []
    assert ordered_drafts("x-5", ["only:1"]) == ["only:1"]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="drafts must be >= 1"):
        first_choices(3, 0)
    with pytest.raises(ValueError, match="ordinal"):
        preference(-1, 2)
