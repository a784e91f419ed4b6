"""The reference for stop sequences: the whole text decoded again for every check. Quadratic, so the servers use
the incremental :class:`starsd.openai_api.detokenize.StopWatch`; the tests hold it to this."""

from __future__ import annotations

from collections.abc import Callable


def find_stop(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop sequence begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def stop_check(decode: Callable[[list[int]], str], stops: list[str]) -> Callable[[list[int], list[int]], int | None]:
    """A check for the generation loop: of a round's ``new`` tokens after ``before``, how many to keep because a
    stop sequence ends within them (the tokens up to and including the one that completes it), or None.

    Usage and ``token_ids`` then count the tokens up to the stop, as OpenAI and vLLM do.
    """

    def check(before: list[int], new: list[int]) -> int | None:
        if find_stop(decode(before + new), stops) is None:
            return None
        for k in range(1, len(new)):
            if find_stop(decode(before + new[:k]), stops) is not None:
                return k
        return len(new)

    return check
