"""Incremental detokenisation and stop sequences: each round decodes only its own tokens, not the whole output.

Decoding the whole output again every round costs time in proportion to its length (quadratic in all). Here a
token is decoded within a short window of the tokens before it (the approach of vLLM's and TGI's detokenisers):
the text a token adds is ``decode(window + token)`` minus ``decode(window)``, held back while it ends in an
incomplete UTF-8 sequence (U+FFFD) until later tokens complete it. For byte-level BPE tokenizers the text is
exactly ``decode(all tokens)``; :class:`Detokenizer` also records where each token's text ends, which is what
stop sequences and ``logprobs.text_offset`` need.
"""

from __future__ import annotations

from collections.abc import Callable

# Tokens of context a window keeps before the ones not yet turned into text (enough for merges across tokens).
WINDOW = 6


class Detokenizer:
    """The text of a growing list of token ids, extended a few tokens at a time."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""
        self.ends: list[int] = []  # len(text) once token i was added (text of a pending token counts later)
        self._prefix = 0  # ids[_prefix:_read] are decoded context; ids[_read:] are not turned into text yet
        self._read = 0

    def add(self, tokens: list[int]) -> str:
        """Append ``tokens``; returns the text they complete."""
        start = len(self.text)
        for t in tokens:
            self.ids.append(t)
            context = self._decode(self.ids[self._prefix : self._read])
            full = self._decode(self.ids[self._prefix :])
            if len(full) > len(context) and not full.endswith("\ufffd"):
                self.text += full[len(context) :]
                self._prefix = max(self._read, len(self.ids) - WINDOW)
                self._read = len(self.ids)
            self.ends.append(len(self.text))
        return self.text[start:]


def earliest_stop(text: str, stops: list[str], start: int = 0) -> tuple[int, int] | None:
    """``(begin, end)`` of the stop sequence that ends first in ``text`` (searching from ``start``), or None."""
    best: tuple[int, int] | None = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i + len(s) < best[1]):
            best = (i, i + len(s))
    return best


class StopWatch:
    """A completion's text and its stop sequences, fed round by round (the engine's ``StopCheck``).

    ``check(before, new)`` adds ``new`` and says how many of them to keep: through the token whose text
    completes a stop sequence, as OpenAI and vLLM count them. ``text`` is then the output cut where that
    stop sequence begins.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self.detok = Detokenizer(decode)
        self.stops = stops
        self.cut: int | None = None  # where the output ends, once a stop sequence was found
        self._longest = max((len(s) for s in stops), default=0)

    @property
    def text(self) -> str:
        return self.detok.text if self.cut is None else self.detok.text[: self.cut]

    def check(self, before: list[int], new: list[int]) -> int | None:
        count = len(self.detok.ids)
        searched = max(0, len(self.detok.text) - self._longest + 1)
        self.detok.add(new)
        if not self.stops or self.cut is not None:
            return None
        hit = earliest_stop(self.detok.text, self.stops, searched)
        if hit is None:
            return None
        self.cut = hit[0]
        ends = self.detok.ends[count:]
        return next(k + 1 for k, end in enumerate(ends) if end >= hit[1])

    def streamable(self) -> int:
        """How much of ``text`` may be sent: all of it but a tail that could begin a stop sequence."""
        if self.cut is not None or not self.stops:
            return len(self.text)
        return stream_safe_length(self.text, self.stops)


def stream_safe_length(text: str, stops: list[str]) -> int:
    """How much of ``text`` can be streamed without risking to emit the start of a stop sequence."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold
