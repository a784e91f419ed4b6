"""metav1.Condition rendering: transition times move only when the status does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from starsd_operator.conditions import Condition, find, parse_timestamp, render, timestamp

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_shape() -> None:
    [cond] = render([Condition("Ready", True, "Ready", "all good")], [], generation=3, now=T0)
    assert cond == {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "all good",
        "lastTransitionTime": "2026-03-01T12:00:00Z",
        "observedGeneration": 3,
    }


def test_the_transition_time_stays_while_the_status_holds() -> None:
    first = render([Condition("Ready", False, "Progressing", "0 of 2")], [], generation=1, now=T0)
    again = render([Condition("Ready", False, "Unschedulable", "no node")], first, generation=1, now=T1)
    assert again[0]["lastTransitionTime"] == timestamp(T0)
    assert again[0]["reason"] == "Unschedulable"
    flipped = render([Condition("Ready", True, "Ready", "")], again, generation=1, now=T1)
    assert flipped[0]["lastTransitionTime"] == timestamp(T1)


def test_conditions_of_other_types_are_kept() -> None:
    foreign = [{"type": "Audited", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t"}]
    out = render([Condition("Ready", True, "Ready")], foreign, generation=None, now=T0)
    assert [c["type"] for c in out] == ["Ready", "Audited"]
    assert "observedGeneration" not in out[0]


def test_long_messages_are_cut() -> None:
    [cond] = render([Condition("Ready", False, "X", "m" * 5000)], [], generation=1, now=T0)
    assert len(cond["message"]) == 1024 and cond["message"].endswith("...")


def test_find_and_timestamps() -> None:
    assert find([{"type": "A"}, {"type": "B"}], "B") == {"type": "B"}
    assert find(None, "A") is None
    assert parse_timestamp("2026-03-01T12:00:00Z") == T0
    assert parse_timestamp("yesterday") is None and parse_timestamp(None) is None
