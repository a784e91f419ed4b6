"""vLLM's rows -> StarSD's draft sessions: the pure planning of one step (no vLLM, no gRPC here).

vLLM hands a proposer the rows of its batch (each row's committed tokens), never request ids, and it reorders
and condenses rows as requests finish. The draft keeps a session per completion: what it has been told so far.
A row continues the session whose told tokens it extends, and sends only its new tokens.

Why matching by tokens is sound: the draft's state for a session is a function of the tokens it was told and
nothing else. A row whose tokens extend a session's told tokens is, as far as the draft can tell, the same
completion a few tokens later, whichever request vLLM holds in that row now: rows that moved (reordered,
condensed) are found by their tokens, and two requests with the same history may swap sessions harmlessly.
Whatever the draft proposes, vLLM's rejection sampler verifies it against the target, so a poor match can only
cost acceptance, never change an output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int64]


def as_tokens(tokens: Sequence[int] | npt.NDArray[np.integer]) -> Tokens:
    """A row's tokens as the 1-D int64 array the planner compares (a copy: vLLM reuses its buffers)."""
    return np.array(tokens, dtype=np.int64).reshape(-1)


@dataclass(frozen=True, eq=False)
class Session:
    """One completion's session on the draft, as this replica knows it."""

    session_id: int
    told: Tokens  # every token the draft has been told for this session (committed tokens only)
    seq: int  # the sequence number of its latest request (1 on the first)
    last_step: int  # the step it last drafted for


@dataclass(frozen=True, eq=False)
class Ask:
    """One row's request in a step's burst."""

    row: int
    session_id: int
    seq: int
    new_tokens: list[int]  # what the draft has not been told yet (the whole context on seq 1)
    gamma: int
    context: Tokens  # the row's tokens: the session's told tokens once the draft answers


@dataclass(frozen=True)
class StepPlan:
    asks: list[Ask]
    release: list[Session] = field(default_factory=list)  # sessions to free on the draft (not seen for a while)
    matches: dict[int, int] = field(default_factory=dict)  # row -> session id continued (new sessions included)


def extends(row: Tokens, told: Tokens) -> bool:
    """Whether ``row`` is ``told`` followed by zero or more tokens."""
    n = told.shape[0]
    if n > row.shape[0]:
        return False
    # Cheap rejections first: most sessions differ from a row in their last told token.
    if n and row[n - 1] != told[n - 1]:
        return False
    return bool(np.array_equal(row[:n], told))


def match_rows(
    rows: Sequence[Tokens | None],
    sessions: Mapping[int, Session],
    previous: Mapping[int, int],
) -> list[int | None]:
    """For each row, the id of the session it continues, or None (open a new one); rows given as None skip.

    A session is continued by one row at most. A row first tries the session it continued in the previous step
    (``previous``: row -> session id; the common case, rows that did not move), then the session with the most
    told tokens among those it extends (rows that moved; the longest match sends the fewest tokens).
    """
    out: list[int | None] = [None] * len(rows)
    claimed: set[int] = set()
    for i, row in enumerate(rows):
        sid = previous.get(i)
        if row is None or sid is None or sid not in sessions or sid in claimed:
            continue
        if extends(row, sessions[sid].told):
            out[i] = sid
            claimed.add(sid)
    for i, row in enumerate(rows):
        if row is None or out[i] is not None:
            continue
        best: Session | None = None
        for session in sessions.values():
            if session.session_id in claimed or (best is not None and session.told.shape[0] <= best.told.shape[0]):
                continue
            if extends(row, session.told):
                best = session
        if best is not None:
            out[i] = best.session_id
            claimed.add(best.session_id)
    return out


def row_gamma(length: int, gamma: int, max_model_len: int, draft_max_context: int) -> int:
    """Tokens to ask for a row of ``length`` committed tokens: ``gamma``, less what would run past vLLM's
    ``max_model_len`` (the bonus token included) or the draft's context; 0 when nothing fits."""
    return max(0, min(gamma, max_model_len - length - 1, draft_max_context - length))


def plan_step(
    rows: Sequence[Tokens | None],
    gammas: Sequence[int],
    sessions: Mapping[int, Session],
    previous: Mapping[int, int],
    step: int,
    idle_steps: int,
    new_session_id: Callable[[], int],
) -> StepPlan:
    """The burst of one step: an ask per row that drafts (``rows[i]`` not None and ``gammas[i] > 0``), and the
    sessions to free, those no row continued for ``idle_steps`` steps (their completions finished)."""
    drafting = [row if row is not None and gammas[i] > 0 else None for i, row in enumerate(rows)]
    matched = match_rows(drafting, sessions, previous)
    asks: list[Ask] = []
    matches: dict[int, int] = {}
    for i, row in enumerate(drafting):
        if row is None:
            continue
        sid = matched[i]
        if sid is None:
            ask = Ask(i, new_session_id(), 1, row.tolist(), gammas[i], row)
        else:
            s = sessions[sid]
            ask = Ask(i, sid, s.seq + 1, row[s.told.shape[0] :].tolist(), gammas[i], row)
        asks.append(ask)
        matches[i] = ask.session_id
    continued = set(matches.values())
    release = [s for s in sessions.values() if s.session_id not in continued and step - s.last_step >= idle_steps]
    return StepPlan(asks, release, matches)


def timed_since_last_step(ask: Ask, sessions: Mapping[int, Session], step: int) -> bool:
    """Whether the time since the previous step's proposals came back was this ask's verify time: its session
    drafted in that step. A new session, or one back after steps without drafts (a cooldown, a prefill, an idle
    replica), would report the gap as a verify pass and inflate the draft's Tp."""
    session = sessions.get(ask.session_id)
    return session is not None and session.last_step == step - 1


def apply_answers(
    sessions: Mapping[int, Session], plan: StepPlan, answered: set[int], step: int
) -> tuple[dict[int, Session], list[Session]]:
    """The sessions after a step (the plan's releases gone), and the sessions of its failed asks.

    An answered ask (its row in ``answered``) moves its session to the row's tokens. An unanswered one (the
    draft was late, refused it, or the stream broke) leaves the draft's view of its session unknown: the session
    is dropped (the caller frees it on the draft), and the row opens a new one next time.
    """
    out = dict(sessions)
    failed: list[Session] = []
    for s in plan.release:
        out.pop(s.session_id, None)
    for ask in plan.asks:
        if ask.row in answered:
            prior = out.get(ask.session_id)
            told = ask.context
            if prior is None:
                out[ask.session_id] = Session(ask.session_id, told, ask.seq, step)
            else:
                out[ask.session_id] = replace(prior, told=told, seq=ask.seq, last_step=step)
        else:
            out.pop(ask.session_id, None)
            failed.append(Session(ask.session_id, ask.context, ask.seq, step))
    return out, failed
