"""A target's drafts: the --draft list, and the policy that picks, fails over and moves back (no I/O here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from starsd import cli
from starsd.assignment import ordered_drafts
from starsd.proto import starsd_pb2 as pb
from starsd.verifier.draft_pool import DraftListError, DraftPolicy, Reason, has_room, parse_draft_addresses

# --- the --draft list ---------------------------------------------------------------------------------------


def test_one_address_is_a_list_of_one() -> None:
    assert parse_draft_addresses("chat-draft.ml.svc:50051") == ["chat-draft.ml.svc:50051"]


def test_empty_means_no_draft() -> None:
    assert parse_draft_addresses("") == []
    assert parse_draft_addresses("   ") == []


def test_a_list_keeps_the_operators_order() -> None:
    text = "d-0.d:50051, d-1.d:50051,d-2.d:50051"
    assert parse_draft_addresses(text) == ["d-0.d:50051", "d-1.d:50051", "d-2.d:50051"]


def test_ipv6_and_unix_addresses_pass() -> None:
    assert parse_draft_addresses("[::1]:50051,unix:/run/draft.sock") == ["[::1]:50051", "unix:/run/draft.sock"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a:1,,b:2", "entry 2 is empty"),
        ("a:1,", "entry 2 is empty"),
        (",a:1", "entry 1 is empty"),
        ("a:1,b", "entry 2 ('b') has no port"),
        ("a:1,b:", "entry 2 ('b:') has no port"),
        (":50051", "entry 1 (':50051') has no port"),
        ("a:http", "has port 'http'"),
        ("a:0", "has port '0'"),
        ("a:65536", "has port '65536'"),
        ("a:1,b:2,a:1", "entry 3 ('a:1') is listed twice"),
        ("a :1", "contains whitespace"),
    ],
)
def test_malformed_lists_are_refused_with_the_entry_named(text: str, says: str) -> None:
    with pytest.raises(DraftListError, match=r"--draft") as err:
        parse_draft_addresses(text)
    assert says in str(err.value)


# --- room ---------------------------------------------------------------------------------------------------


def test_an_old_draft_without_load_fields_has_room() -> None:
    assert has_room(pb.InfoResponse(max_sessions=4))


def test_room_is_below_the_utilization_threshold_and_the_session_limit() -> None:
    assert has_room(pb.InfoResponse(max_sessions=10, utilization=0.5, sessions=9))
    assert not has_room(pb.InfoResponse(max_sessions=10, utilization=0.95, sessions=1))
    assert not has_room(pb.InfoResponse(max_sessions=10, utilization=0.1, sessions=10))
    assert has_room(pb.InfoResponse(max_sessions=10, utilization=0.5), room_utilization=0.6)
    assert not has_room(pb.InfoResponse(max_sessions=10, utilization=0.5), room_utilization=0.5)


# --- the policy ---------------------------------------------------------------------------------------------

DRAFTS = ("d0:1", "d1:1", "d2:1")


def test_at_start_every_draft_is_tried_by_rank() -> None:
    assert DraftPolicy(DRAFTS).attempts() == [0, 1, 2]


def test_a_lost_draft_is_retried_once_then_the_others_by_rank() -> None:
    policy = DraftPolicy(DRAFTS)
    assert policy.connected(1, now=0.0) is None  # the first draft used: not a move
    policy.lost()
    assert policy.rank is None
    assert policy.attempts() == [1, 0, 2]


def test_a_reconnect_to_the_same_draft_is_not_a_move() -> None:
    policy = DraftPolicy(DRAFTS)
    policy.connected(0, now=0.0)
    policy.lost()
    assert policy.connected(0, now=1.0) is None


def test_failing_over_is_a_move_because_the_draft_was_lost() -> None:
    policy = DraftPolicy(DRAFTS)
    policy.connected(0, now=0.0)
    policy.lost()
    assert policy.connected(2, now=1.0) is Reason.DRAFT_LOST
    assert (policy.rank, policy.last) == (2, 2)


def test_on_the_first_choice_nothing_is_probed() -> None:
    policy = DraftPolicy(DRAFTS, probe_seconds=3.0)
    assert policy.probe_delay(now=0.0) is None
    policy.connected(0, now=0.0)
    assert policy.probe_delay(now=100.0) is None


def test_away_from_the_first_choice_it_is_probed_every_interval() -> None:
    policy = DraftPolicy(DRAFTS, probe_seconds=3.0)
    policy.connected(0, now=0.0)
    policy.lost()
    policy.connected(1, now=10.0)
    assert policy.probe_delay(now=10.0) == 3.0
    assert policy.probe_delay(now=12.0) == 1.0
    assert policy.probe_delay(now=20.0) == 0.0
    assert policy.probed(now=20.0, answered=False, room=False) is False
    assert policy.probe_delay(now=21.0) == 2.0  # the next probe is an interval after the last
    assert policy.probed(now=23.0, answered=True, room=False) is False  # back, but busy: stay
    assert policy.rank == 1
    assert policy.probed(now=26.0, answered=True, room=True) is True
    assert policy.connected(0, now=26.5) is Reason.FIRST_CHOICE_BACK
    assert policy.probe_delay(now=30.0) is None


def test_lost_while_away_then_first_choice_reached_by_a_sweep_counts_as_draft_lost() -> None:
    policy = DraftPolicy(DRAFTS)
    policy.connected(1, now=0.0)
    policy.lost()
    assert policy.attempts() == [1, 0, 2]
    assert policy.connected(0, now=1.0) is Reason.DRAFT_LOST


def test_a_lost_draft_is_not_probed() -> None:
    policy = DraftPolicy(DRAFTS)
    policy.connected(2, now=0.0)
    policy.lost()
    assert policy.probe_delay(now=50.0) is None
    assert policy.probed(now=50.0, answered=True, room=True) is False  # nothing to move back from


@pytest.mark.parametrize(
    ("order", "probe", "says"),
    [((), 3.0, "at least one draft"), (("a:1", "a:1"), 3.0, "listed twice"), (("a:1",), 0.0, "probe_seconds")],
)
def test_a_policy_refuses_bad_settings(order: tuple[str, ...], probe: float, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        DraftPolicy(order, probe_seconds=probe)


def test_a_rank_outside_the_order_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 3"):
        DraftPolicy(DRAFTS).connected(3, now=0.0)


def test_every_target_of_a_lost_draft_has_a_live_draft_next() -> None:
    """With the operator's list, each target's order puts its own draft first and every other draft after it,
    so losing any one draft leaves each of its targets a next draft that is a different, live one."""
    listed = [f"d-{i}:50051" for i in range(3)]
    for ordinal in range(12):
        order = tuple(ordered_drafts(f"t-{ordinal}", listed))
        policy = DraftPolicy(order)
        policy.connected(0, now=0.0)
        policy.lost()
        attempts = policy.attempts()
        assert attempts[0] == 0 and sorted(attempts) == [0, 1, 2]
        assert order[attempts[1]] != order[0]


# --- the command line ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "says"),
    [("a:1,,b:2", "entry 2 is empty"), ("a:1,b", "has no port"), ("a:1,a:1", "listed twice")],
)
def test_the_target_refuses_a_malformed_list_before_loading_its_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, draft: str, says: str
) -> None:
    missing = tmp_path / "no-such-model"  # never reached: the list is checked first
    assert cli.main(["target", "--model", str(missing), "--draft", draft]) == 2
    err = capsys.readouterr().err
    assert err.startswith("starsd: error: --draft") and says in err


def test_the_target_help_describes_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["target", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "HOST:PORT[,HOST:PORT...]" in text and "comma-separated list of every draft" in text


def test_local_refuses_no_drafts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["local", "--drafts", "0"]) == 2
    assert "--drafts must be >= 1" in capsys.readouterr().err


def test_the_target_refuses_a_missing_tls_ca_before_loading_its_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model"
    args = ["target", "--model", str(missing), "--draft", "a:1", "--draft-tls-ca", str(tmp_path / "ca.pem")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "--draft-tls-ca" in err and "no such file" in err


# --- drafts found live (--drafts-from) ------------------------------------------------------------------------


def test_a_new_first_choice_found_live_is_probed_at_once_and_moving_to_it_is_a_drafts_change() -> None:
    policy = DraftPolicy(("a", "b"), probe_seconds=3.0, live=True)
    policy.connected(0, now=0.0)
    assert policy.probe_delay(1.0) is None  # on the first choice
    policy.reorder(("c", "a", "b"), now=1.0)
    assert policy.rank == 1 and policy.probe_delay(1.0) == 0.0
    assert policy.probed(1.0, answered=True, room=True)
    assert policy.connected(0, now=1.1) is Reason.DRAFTS_CHANGED


def test_a_draft_in_use_that_leaves_the_list_is_displaced_until_the_client_moves_off_it() -> None:
    policy = DraftPolicy(("a", "b", "c"), probe_seconds=3.0, live=True)
    policy.connected(1, now=0.0)
    policy.reorder(("a", "c"), now=5.0)
    assert policy.displaced == "b" and policy.rank is None and policy.probe_delay(5.0) == 0.0
    assert policy.attempts() == [0, 1]
    policy.escaped(5.0, found=False)  # no other draft answered: stay on it, try again one interval later
    assert policy.probe_delay(5.0) == 3.0
    policy.reorder(("a",), now=6.0)  # still not listed: still displaced, the next try as planned
    assert policy.displaced == "b" and policy.probe_delay(6.0) == 2.0
    assert policy.connected(0, now=7.0) is Reason.DRAFTS_CHANGED
    assert policy.displaced is None and policy.rank == 0


def test_a_displaced_draft_listed_again_is_simply_in_use_again() -> None:
    policy = DraftPolicy(("a", "b"), live=True)
    policy.connected(0, now=0.0)
    policy.reorder(("b",), now=1.0)
    policy.reorder(("a", "b"), now=2.0)
    assert policy.displaced is None and policy.rank == 0


def test_a_live_order_may_be_empty_and_then_nothing_is_tried() -> None:
    policy = DraftPolicy((), live=True)
    assert policy.attempts() == [] and policy.probe_delay(0.0) is None
    policy.reorder(("a",), now=0.0)
    assert policy.attempts() == [0]
    with pytest.raises(ValueError, match="listed twice"):
        policy.reorder(("a", "a"), now=0.0)
