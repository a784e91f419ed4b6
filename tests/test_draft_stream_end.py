"""The draft's one end-of-stream rule (starsd.draft.core.Stream): a stream ends after the target's last request
and the last answer it is owed, whichever comes last; an aborted stream ends at once."""

from __future__ import annotations

import asyncio

from starsd.draft.core import Stream
from starsd.proto import starsd_pb2 as pb


def drained(stream: Stream) -> list[int | None]:
    """The seq of each message queued so far (None: the end of the stream)."""
    out: list[int | None] = []
    while not stream.outgoing.empty():
        response = stream.outgoing.get_nowait()
        out.append(None if response is None else int(response.seq))
    return out


def test_a_stream_ends_after_the_last_answer_it_owes() -> None:
    async def scenario() -> list[int | None]:
        stream = Stream(loop=asyncio.get_running_loop())
        stream.pending = 2
        stream.answer(pb.ProposeResponse(seq=1))
        stream.input_ended()  # the target sent its last request: one answer is still owed
        stream.answer(pb.ProposeResponse(seq=2))
        return drained(stream)

    assert asyncio.run(scenario()) == [1, 2, None]


def test_a_stream_that_owes_nothing_ends_with_its_input() -> None:
    async def scenario() -> tuple[list[int | None], list[int | None]]:
        idle = Stream(loop=asyncio.get_running_loop())
        before = drained(idle)
        idle.input_ended()
        return before, drained(idle)

    assert asyncio.run(scenario()) == ([], [None])


def test_an_aborted_stream_ends_at_once_and_answers_go_on_no_longer_awaited() -> None:
    async def scenario() -> list[int | None]:
        stream = Stream(loop=asyncio.get_running_loop())
        stream.pending = 1
        stream.input_ended(aborted=True)
        return drained(stream)

    assert asyncio.run(scenario()) == [None]
