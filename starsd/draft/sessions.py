"""Per-session draft state, keyed by (target id, session id): isolated, bounded, and freed when done."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

SessionKey = tuple[str, int]


class SessionError(Exception):
    """A request that cannot be served; ``code`` is the gRPC status code answered for it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Session:
    key: SessionKey
    state: Any  # the proposer's per-session state (KV cache, RNG)
    owner: object  # the stream that opened it: when that stream ends, the session is freed
    next_seq: int = 1
    last_used: float = 0.0
    busy: bool = False  # a request of this session is queued or being computed
    last_draft_seconds: float = 0.0  # queue wait + service of its previous request (to derive Tc)


class SessionStore:
    """The draft's sessions. Not thread-safe: used from the event loop only."""

    def __init__(self, max_sessions: int, idle_timeout: float, clock: Callable[[], float] = time.monotonic):
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._sessions: dict[SessionKey, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: SessionKey) -> bool:
        return key in self._sessions

    def admit(self, key: SessionKey, seq: int, owner: object, make_state: Callable[[], Any]) -> Session:
        """The session a request with sequence number ``seq`` belongs to; opened when ``seq`` is 1."""
        session = self._sessions.get(key)
        if seq == 1:
            if session is not None:
                raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, f"session {key[1]} already started (seq 1 again)")
            if len(self._sessions) >= self.max_sessions:
                raise SessionError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the draft holds its maximum of {self.max_sessions} sessions; retry later",
                )
            session = Session(key=key, state=make_state(), owner=owner)
            self._sessions[key] = session
        elif session is None:
            raise SessionError(
                grpc.StatusCode.NOT_FOUND,
                f"unknown session {key[1]} (released or expired): start again at seq 1",
            )
        if session.owner is not owner:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, f"session {key[1]} belongs to another stream")
        if seq != session.next_seq:
            raise SessionError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"out-of-order request for session {key[1]}: seq {seq}, expected {session.next_seq}",
            )
        if session.busy:
            raise SessionError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"session {key[1]} sent seq {seq} before its previous answer",
            )
        session.next_seq += 1
        session.last_used = self._clock()
        return session

    def release(self, key: SessionKey, owner: object) -> bool:
        """Free a session; only the stream that opened it may (others are refused)."""
        session = self._sessions.get(key)
        if session is None:
            return False
        if session.owner is not owner:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, f"session {key[1]} belongs to another stream")
        del self._sessions[key]
        return True

    def release_owner(self, owner: object) -> int:
        """Free every session opened on one stream (the target disconnected)."""
        keys = [k for k, s in self._sessions.items() if s.owner is owner]
        for k in keys:
            del self._sessions[k]
        return len(keys)

    def sweep(self) -> int:
        """Free sessions idle for longer than the timeout (targets that vanished without a word)."""
        limit = self._clock() - self.idle_timeout
        keys = [k for k, s in self._sessions.items() if not s.busy and s.last_used < limit]
        for k in keys:
            del self._sessions[k]
        return len(keys)
