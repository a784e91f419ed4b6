"""Incremental detokenisation: each round decodes a few tokens, yet the text is exactly the whole decode, and
stop sequences cut where the whole-text check (tests.support.stops.stop_check) cuts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from starsd.openai_api.detokenize import Detokenizer, StopWatch, earliest_stop
from starsd.vocab import load_tokenizer
from tests.support.stops import find_stop, stop_check


@pytest.fixture(scope="module")
def tokenizer(shipped_pair: tuple[Path, Path]) -> Any:
    return load_tokenizer(shipped_pair[1])


def _chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(ids[i : i + n])
        i += n
    return out


def test_the_incremental_text_is_the_whole_decode(tokenizer: Any) -> None:
    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=True)
        return text

    rng = random.Random(5)
    texts = ["def f(x):\n    return x * 2  # héllo ✓ 日本語 🙂\n", "a\u00e9\u4e2d\U0001f600b" * 5]
    sequences = [tokenizer.encode(t) for t in texts]
    sequences += [[rng.randrange(len(tokenizer)) for _ in range(200)] for _ in range(20)]  # any ids, split UTF-8
    for ids in sequences:
        detok = Detokenizer(decode)
        for chunk in _chunks(ids, rng):
            detok.add(chunk)
            assert not detok.text.endswith("\ufffd") or decode(detok.ids).endswith(detok.text[-1:])
        whole = decode(ids)
        pending = whole[len(detok.text) :]
        assert whole.startswith(detok.text)
        assert set(pending) <= {"\ufffd"}  # only an incomplete UTF-8 sequence at the very end waits
        assert detok.ends == sorted(detok.ends) and len(detok.ends) == len(ids)


def test_the_stop_watch_cuts_where_the_whole_text_check_cuts(tokenizer: Any) -> None:
    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=True)
        return text

    rng = random.Random(11)
    source = tokenizer.encode("import os\nimport sys\n\nclass Parser:\n    def parse(self, text):\n        return 1\n")
    for _ in range(40):
        text = decode(source)
        start = rng.randrange(len(text) - 4)
        stops = [text[start : start + rng.randint(1, 4)], "zzz"]
        watch, reference = StopWatch(decode, stops), stop_check(decode, stops)
        before: list[int] = []
        for chunk in _chunks(source, rng):
            keep = watch.check(before, chunk)
            assert keep == reference(before, chunk)
            if keep is not None:
                break
            before += chunk
        assert watch.cut is not None
        assert watch.text == text[: find_stop(text, stops)]


def test_streaming_holds_back_what_may_start_a_stop_sequence() -> None:
    pieces = {1: "hello ", 2: "wor", 3: "ld!"}
    watch = StopWatch(lambda ids: "".join(pieces[i] for i in ids), ["world"])
    assert watch.check([], [1, 2]) is None
    assert watch.text[: watch.streamable()] == "hello "
    assert watch.check([1, 2], [3]) == 1
    assert watch.text == "hello " and watch.streamable() == len("hello ")
    assert earliest_stop("abcdef", ["cdef", "bc"]) == (1, 3)  # the one that ends first
