"""The vLLM proposer's pure planning: rows -> draft sessions, the step's burst, what a step leaves behind.
No vLLM and no draft here (starsd.integrations.vllm.rows)."""

from __future__ import annotations

import itertools

import numpy as np

from starsd.integrations.vllm.rows import (
    Session,
    StepPlan,
    apply_answers,
    as_tokens,
    extends,
    match_rows,
    plan_step,
    row_gamma,
    timed_since_last_step,
)


def session(sid: int, told: list[int], seq: int = 1, last_step: int = 0) -> Session:
    return Session(sid, as_tokens(told), seq, last_step)


def ids(start: int = 100) -> itertools.count[int]:
    return itertools.count(start)


def test_extends_is_prefix_equality() -> None:
    assert extends(as_tokens([1, 2, 3]), as_tokens([1, 2]))
    assert extends(as_tokens([1, 2]), as_tokens([1, 2]))
    assert extends(as_tokens([1, 2]), as_tokens([]))
    assert not extends(as_tokens([1, 2]), as_tokens([1, 2, 3]))
    assert not extends(as_tokens([1, 9, 3]), as_tokens([1, 2, 3]))
    assert not extends(as_tokens([9, 2, 3, 4]), as_tokens([1, 2, 3]))  # differs before the last told token


def test_rows_that_moved_find_their_sessions_by_tokens() -> None:
    sessions = {1: session(1, [5, 6, 7]), 2: session(2, [8, 9])}
    # Rows swapped since the previous step (whose hints now point at the wrong rows), and both grew.
    rows = [as_tokens([8, 9, 10]), as_tokens([5, 6, 7, 11, 12])]
    assert match_rows(rows, sessions, previous={0: 1, 1: 2}) == [2, 1]


def test_condensed_batch_keeps_the_survivors_sessions() -> None:
    sessions = {1: session(1, [1, 1]), 2: session(2, [2, 2]), 3: session(3, [3, 3])}
    # The request in row 0 finished; vLLM moved the last row into its place.
    rows = [as_tokens([3, 3, 4]), as_tokens([2, 2, 4])]
    assert match_rows(rows, sessions, previous={0: 1, 1: 2, 2: 3}) == [3, 2]


def test_a_session_is_continued_by_one_row_only() -> None:
    sessions = {1: session(1, [4, 4])}
    rows = [as_tokens([4, 4, 1]), as_tokens([4, 4, 2])]  # same prompt, two requests
    assert match_rows(rows, sessions, previous={}) == [1, None]


def test_the_longest_told_session_wins() -> None:
    sessions = {1: session(1, [4]), 2: session(2, [4, 5, 6])}
    assert match_rows([as_tokens([4, 5, 6, 7])], sessions, previous={}) == [2]


def test_a_diverged_row_opens_a_new_session() -> None:
    sessions = {1: session(1, [4, 5, 6])}
    # Same length prefix but a different token: another completion (or the same one re-prefilled differently).
    assert match_rows([as_tokens([4, 5, 9, 7])], sessions, previous={0: 1}) == [None]


def test_rows_without_tokens_are_skipped() -> None:
    sessions = {1: session(1, [4])}
    assert match_rows([None, as_tokens([4, 5])], sessions, previous={0: 1}) == [None, 1]


def test_row_gamma_stays_inside_both_contexts() -> None:
    assert row_gamma(10, 4, max_model_len=1024, draft_max_context=512) == 4
    assert row_gamma(1020, 4, max_model_len=1024, draft_max_context=2048) == 3  # room for the bonus token
    assert row_gamma(510, 4, max_model_len=1024, draft_max_context=512) == 2
    assert row_gamma(1023, 4, max_model_len=1024, draft_max_context=2048) == 0
    assert row_gamma(2000, 4, max_model_len=1024, draft_max_context=512) == 0


def test_plan_sends_only_new_tokens_and_opens_sessions_with_the_whole_context() -> None:
    sessions = {7: session(7, [1, 2, 3], seq=4)}
    rows = [as_tokens([9, 9]), as_tokens([1, 2, 3, 4, 5])]
    plan = plan_step(rows, [3, 3], sessions, {}, step=10, idle_steps=5, new_session_id=ids().__next__)
    by_row = {a.row: a for a in plan.asks}
    assert (by_row[0].session_id, by_row[0].seq, by_row[0].new_tokens) == (100, 1, [9, 9])
    assert (by_row[1].session_id, by_row[1].seq, by_row[1].new_tokens) == (7, 5, [4, 5])
    assert plan.matches == {0: 100, 1: 7}
    assert plan.release == []


def test_rows_with_no_gamma_are_not_asked_and_do_not_claim_sessions() -> None:
    sessions = {7: session(7, [1, 2])}
    rows = [as_tokens([1, 2, 3]), as_tokens([1, 2, 3])]
    plan = plan_step(rows, [0, 2], sessions, {0: 7}, step=1, idle_steps=5, new_session_id=ids().__next__)
    assert [(a.row, a.session_id) for a in plan.asks] == [(1, 7)]


def test_only_a_session_drafted_in_the_previous_step_reports_the_time_since_as_its_verify() -> None:
    sessions = {1: session(1, [1, 2], last_step=9), 2: session(2, [5, 6], last_step=7)}
    rows = [as_tokens([1, 2, 3]), as_tokens([5, 6, 7]), as_tokens([8])]
    plan = plan_step(rows, [2, 2, 2], sessions, {}, step=10, idle_steps=5, new_session_id=ids().__next__)
    timed = {a.row: timed_since_last_step(a, sessions, step=10) for a in plan.asks}
    # Row 0 continues a session of step 9; row 1 one last drafted at step 7 (steps without drafts since); row 2
    # opens a session (the time since step 9 was its prefill, or an idle replica, not a verify pass).
    assert timed == {0: True, 1: False, 2: False}


def test_sessions_unseen_for_idle_steps_are_released() -> None:
    sessions = {1: session(1, [1], last_step=3), 2: session(2, [2], last_step=8), 3: session(3, [3], last_step=2)}
    rows = [as_tokens([3, 3])]  # continues session 3, however old
    plan = plan_step(rows, [2], sessions, {}, step=10, idle_steps=5, new_session_id=ids().__next__)
    assert sorted(s.session_id for s in plan.release) == [1]


def test_answered_asks_move_their_sessions_and_failed_ones_are_dropped() -> None:
    sessions = {1: session(1, [1], seq=2), 2: session(2, [2], seq=1), 3: session(3, [3], last_step=0)}
    rows = [as_tokens([1, 5]), as_tokens([2, 6]), as_tokens([8])]
    plan = plan_step(rows, [2, 2, 2], sessions, {}, step=9, idle_steps=5, new_session_id=ids().__next__)
    assert [s.session_id for s in plan.release] == [3]
    after, failed = apply_answers(sessions, plan, answered={0, 2}, step=9)
    assert sorted(after) == [1, 100]
    assert after[1].told.tolist() == [1, 5] and after[1].seq == 3 and after[1].last_step == 9
    assert after[100].told.tolist() == [8] and after[100].seq == 1
    assert [(s.session_id, s.seq) for s in failed] == [(2, 2)]  # the caller frees it after its last request


def test_a_new_session_that_failed_is_not_kept() -> None:
    plan = plan_step([as_tokens([4])], [1], {}, {}, step=1, idle_steps=5, new_session_id=ids().__next__)
    after, failed = apply_answers({}, plan, answered=set(), step=1)
    assert after == {} and [s.session_id for s in failed] == [100]


def test_sessions_follow_a_stream_of_steps_with_reordering() -> None:
    """Several steps of a batch whose rows grow, swap and shrink: each completion keeps its session, and every
    ask carries exactly the tokens the draft has not seen."""
    completions = {"a": [1, 2, 3], "b": [4, 5], "c": [6]}
    told: dict[int, list[int]] = {}  # session id -> what the draft was told, as a draft would record it
    sessions: dict[int, Session] = {}
    previous: dict[int, int] = {}
    orders = [["a", "b", "c"], ["c", "a", "b"], ["b", "c"], ["c", "b"]]
    owner: dict[str, int] = {}
    counter = ids()
    for step, order in enumerate(orders, start=1):
        rows = [as_tokens(completions[name]) for name in order]
        plan: StepPlan = plan_step(rows, [2] * len(rows), sessions, previous, step, 10, counter.__next__)
        for ask in plan.asks:
            name = order[ask.row]
            told.setdefault(ask.session_id, []).extend(ask.new_tokens)
            assert told[ask.session_id] == completions[name]
            owner.setdefault(name, ask.session_id)
            assert owner[name] == ask.session_id, f"{name} changed sessions at step {step}"
        sessions, failed = apply_answers(sessions, plan, {a.row for a in plan.asks}, step)
        assert failed == []
        previous = plan.matches
        for name in order:
            completions[name] = [*completions[name], step * 10]
    assert len(set(owner.values())) == 3


def test_as_tokens_copies() -> None:
    buffer = np.array([[1, 2, 3]], dtype=np.int32)
    row = as_tokens(buffer[0, :2])
    buffer[0, 0] = 99
    assert row.tolist() == [1, 2]
