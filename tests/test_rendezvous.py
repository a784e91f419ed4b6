"""Rendezvous hashing, the choice of a target's draft when the drafts are found live: balanced, and a change of
drafts moves exactly the targets that must move (checked target by target, not on average)."""

from __future__ import annotations

import math

import pytest

from starsd import rendezvous
from starsd.verifier.discovery import assign_slots, endpoint, order_for, slot_key

TARGET_IDS = [f"chat-target-h100-{i}" for i in range(400)]  # StatefulSet pod names, as the operator names them
KEYS = [slot_key(s) for s in range(33)]
# The balance bound (docs/architecture.md, "Several drafts"): each draft's share of N targets is Binomial(N, 1/D),
# of standard deviation sqrt(N/D * (1 - 1/D)); the range of D such shares stays within about 2*sqrt(2 ln D)
# standard deviations (under 5.3 for D <= 32). Measured over D = 1..32 and N = 1..400 for these ids: at most 26
# targets apart (D = 9), and (spread - 2) / sqrt(N/D) at most 4.7; the hash is deterministic, so this is exact.
MAX_SPREAD = 26
SPREAD_PER_SQRT_SHARE = 5.0


def choices(ids: list[str], keys: list[str]) -> list[str]:
    picked = [rendezvous.choice(t, keys) for t in ids]
    assert None not in picked
    return [str(p) for p in picked]


def test_the_score_is_stable_and_depends_on_both_ids() -> None:
    assert rendezvous.score("t-0", "draft-0") == rendezvous.score("t-0", "draft-0")
    assert rendezvous.score("t-0", "draft-0") != rendezvous.score("t-0", "draft-1")
    assert rendezvous.score("t-0", "draft-0") != rendezvous.score("t-1", "draft-0")
    # Not a concatenation: the separator keeps ("ab", "c") and ("a", "bc") apart.
    assert rendezvous.score("ab", "c") != rendezvous.score("a", "bc")
    # A fixed value: the hash must not change between releases (targets of two versions must agree).
    assert rendezvous.score("chat-target-h100-0", "draft-0") == 0x97C193A0FE1A2EAF


def test_rank_is_a_total_order_headed_by_the_choice() -> None:
    for t in TARGET_IDS[:50]:
        order = rendezvous.rank(t, KEYS[:8])
        assert sorted(order) == sorted(KEYS[:8])
        assert order[0] == rendezvous.choice(t, KEYS[:8])
        assert rendezvous.rank(t, reversed(KEYS[:8])) == order  # the input's order does not matter
    assert rendezvous.choice("t", []) is None and rendezvous.rank("t", []) == []


def test_the_drafts_share_the_targets_within_the_stated_spread() -> None:
    worst = 0
    for drafts in range(1, 33):
        counts = dict.fromkeys(KEYS[:drafts], 0)
        for n, picked in enumerate(choices(TARGET_IDS, KEYS[:drafts]), start=1):
            counts[picked] += 1
            spread = max(counts.values()) - min(counts.values())
            assert spread <= 2 + SPREAD_PER_SQRT_SHARE * math.sqrt(n / drafts), (drafts, n, counts)
            worst = max(worst, spread)
        if drafts == 1:
            assert counts == {KEYS[0]: 400}
    assert worst <= MAX_SPREAD


@pytest.mark.parametrize("drafts", [1, 2, 3, 4, 7, 8, 16, 31])
def test_adding_a_draft_moves_exactly_the_targets_it_wins(drafts: int) -> None:
    before = choices(TARGET_IDS, KEYS[:drafts])
    after = choices(TARGET_IDS, KEYS[: drafts + 1])
    new = KEYS[drafts]
    moved = {t for t, b, a in zip(TARGET_IDS, before, after, strict=True) if a != b}
    won = {t for t, a in zip(TARGET_IDS, after, strict=True) if a == new}
    assert moved == won
    # About N/(D+1) of them: a Binomial(400, 1/(D+1)) within 5 standard deviations.
    expected = 400 / (drafts + 1)
    assert abs(len(moved) - expected) <= 5 * math.sqrt(expected)


@pytest.mark.parametrize("drafts", [2, 3, 4, 8, 32])
def test_removing_a_draft_moves_exactly_its_targets_to_their_next_choice(drafts: int) -> None:
    gone = KEYS[drafts // 2]
    kept = [k for k in KEYS[:drafts] if k != gone]
    before = choices(TARGET_IDS, KEYS[:drafts])
    after = choices(TARGET_IDS, kept)
    for t, b, a in zip(TARGET_IDS, before, after, strict=True):
        if b == gone:
            assert a == rendezvous.rank(t, KEYS[:drafts])[1]  # its failover order's next
        else:
            assert a == b


def test_a_replaced_draft_pod_takes_its_predecessors_slot_so_only_its_targets_move() -> None:
    ips = [f"10.0.0.{i}" for i in range(1, 5)]
    slots = assign_slots({}, (endpoint(ip, 50051) for ip in ips))
    before = {t: order_for(t, slots)[0] for t in TARGET_IDS}
    # The pod at 10.0.0.2 is replaced by one at 10.0.7.9: first it leaves, then the new one is listed.
    gap = assign_slots(slots, (endpoint(ip, 50051) for ip in ips if ip != "10.0.0.2"))
    back = assign_slots(gap, [*gap, "10.0.7.9:50051"])
    assert back["10.0.7.9:50051"] == slots["10.0.0.2:50051"]
    after = {t: order_for(t, back)[0] for t in TARGET_IDS}
    moved = {t for t in TARGET_IDS if before[t] != after[t]}
    assert moved == {t for t in TARGET_IDS if before[t] == "10.0.0.2:50051"}
    assert {after[t] for t in moved} == {"10.0.7.9:50051"}
    # Both in one answer (the old address gone, the new one there) is the same replacement.
    assert assign_slots(slots, [*gap, "10.0.7.9:50051"]) == back


def test_slots_are_kept_and_new_addresses_take_the_lowest_free_one() -> None:
    slots = assign_slots({}, ["b:1", "a:1"])
    assert slots == {"a:1": 0, "b:1": 1}
    assert assign_slots(slots, ["b:1", "c:1"]) == {"b:1": 1, "c:1": 0}
    assert assign_slots(slots, ["a:1", "b:1", "c:1"]) == {"a:1": 0, "b:1": 1, "c:1": 2}
    assert assign_slots(slots, []) == {}


def test_ipv6_endpoints_are_bracketed() -> None:
    assert endpoint("fd00::5", 50051) == "[fd00::5]:50051"
    assert endpoint("10.1.2.3", 50051) == "10.1.2.3:50051"
