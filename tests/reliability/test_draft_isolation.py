"""Sessions on the draft belong to the stream that opened them: no other stream may touch them.

Target ids are declared by the targets themselves (the hostname by default), so two streams can carry the same
id: a restarted target whose old stream is not yet torn down, two targets started without --id on one host.
"""

from __future__ import annotations

import asyncio

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
        assert answer is not None and answer.error_code and "another stream" in answer.error_message
        assert ("t", 5) in core.sessions
    finally:
        loop.close()


def test_a_stream_cannot_release_another_streams_session() -> None:
    core, loop = _core()
    try:
        mine, other = Stream(loop=loop), Stream(loop=loop)
        core.submit(mine, pb.ProposeRequest(target_id="t", session_id=5, seq=1, gamma=2, tokens=[1, 2], top_p=1.0))
        core.submit(other, pb.ProposeRequest(target_id="t", session_id=5, seq=2, release=True))
        assert ("t", 5) in core.sessions, "another stream freed this stream's session"
    finally:
        loop.close()
