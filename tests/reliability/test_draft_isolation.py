"""Sessions on the draft belong to the stream that opened them: no other stream may touch them.

Target ids are declared by the targets themselves (the hostname by default), so two streams can carry the same
id: a restarted target whose old stream is not yet torn down, two targets started without --id on one host.
"""

from __future__ import annotations

import asyncio

import pytest

from starsd.draft.core import DraftConfig, DraftCore, Stream
from starsd.draft.proposers import EmulatedProposer
from starsd.proto import starsd_pb2 as pb


def _core() -> tuple[DraftCore, asyncio.AbstractEventLoop]:
    return DraftCore(EmulatedProposer(0.0, vocab_size=1000), DraftConfig()), asyncio.new_event_loop()


def test_a_stream_cannot_send_requests_on_another_streams_session() -> None:
    core, loop = _core()
    try:
        mine, other = Stream(loop=loop), Stream(loop=loop)
        core.submit(mine, pb.ProposeRequest(target_id="t", session_id=5, seq=1, gamma=2, tokens=[1, 2], top_p=1.0))
        core.submit(other, pb.ProposeRequest(target_id="t", session_id=5, seq=2, gamma=2, tokens=[3], top_p=1.0))
        answer = other.outgoing.get_nowait()
        assert answer.error_code and "another stream" in answer.error_message
        assert ("t", 5) in core.sessions
    finally:
        loop.close()


@pytest.mark.xfail(
    strict=True,
    reason=(
        "BUG in starsd/draft/core.py: DraftCore.submit handles release=True with sessions.release(key) without "
        "checking that the session's owner is the stream sending it (admit() checks ownership for requests, the "
        "release path does not). A stream carrying the same target id frees another stream's session; that "
        "session's next request is answered NOT_FOUND and its target decodes the round alone. "
        "Fix: look the session up and release it only when session.owner is stream (else ignore the release, or "
        "answer INVALID_ARGUMENT 'session belongs to another stream'); SessionStore.release could take the owner."
    ),
)
def test_a_stream_cannot_release_another_streams_session() -> None:
    core, loop = _core()
    try:
        mine, other = Stream(loop=loop), Stream(loop=loop)
        core.submit(mine, pb.ProposeRequest(target_id="t", session_id=5, seq=1, gamma=2, tokens=[1, 2], top_p=1.0))
        core.submit(other, pb.ProposeRequest(target_id="t", session_id=5, seq=2, release=True))
        assert ("t", 5) in core.sessions, "another stream freed this stream's session"
    finally:
        loop.close()
