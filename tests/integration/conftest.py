"""Stars of real server processes on loopback, shared per test module (start-up costs seconds)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from starsd.checkpoints import LoadedModel, load_checkpoint
from starsd.local import LocalStar
from tests.support.reference import autoregressive_reference


@pytest.fixture(scope="module")
def reference_model(shipped_pair: tuple[Path, Path]) -> LoadedModel:
    return load_checkpoint(shipped_pair[1])


class Reference:
    """The target alone, through transformers' generate(): the oracle for greedy output."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def encode(self, prompt: str | list[int]) -> list[int]:
        return self.model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def greedy(self, prompt: str | list[int], max_tokens: int) -> list[int]:
        ids = tuple(self.encode(prompt))
        key = (ids, max_tokens)
        if key not in self._cache:
            out = autoregressive_reference(self.model, list(ids), max_tokens)
            eos = self.model.eos_token_id
            self._cache[key] = out[: out.index(eos)] if eos in out else out
        return self._cache[key]


@pytest.fixture(scope="module")
def reference(reference_model: LoadedModel) -> Reference:
    return Reference(reference_model)


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples named ``name`` at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def start_star(pair: tuple[Path, Path], targets: int, log_dir: Path, **kw: object) -> LocalStar:
    return LocalStar(draft_model=pair[0], target_model=pair[1], targets=targets, log_dir=log_dir, **kw).start()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def star1(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    """One draft, one target, per test module: nothing else runs on them, so their counters show one
    request's effects."""
    star = start_star(shipped_pair, 1, tmp_path_factory.mktemp("star1"))
    try:
        yield star
    finally:
        star.stop()


@pytest.fixture(scope="module")
def star4(shipped_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    star = start_star(shipped_pair, 4, tmp_path_factory.mktemp("star4"))
    try:
        yield star
    finally:
        star.stop()


PROMPTS: list[str | list[int]] = [
    "def __init__(self",
    "import os\nimport sys\n",
    "class Parser:\n    def parse(self, text):\n",
    "for i in range(",
    "    return self._",
    'if __name__ == "__main__":\n',
    "def read_file(path):\n    with open(",
    "try:\n    import ",
    "# Copyright",
    "    raise ValueError(",
    "self.assertEqual(",
    "from collections import ",
    "def test_",
    "    @property\n    def name(self):\n",
    "while True:\n",
    "lambda x: ",
    "    except KeyError:\n",
    '"""Return the ',
    [40, 41, 42, 43],
    [7, 300, 12],
]
