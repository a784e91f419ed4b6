"""Shared fixtures: model pairs made by the project's own code (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("STARSD_TORCH_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random-initialised (draft, target) pair sharing the project's tokenizer."""
    from starsd.tiny import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("random-pair"), seed=0)


@pytest.fixture(scope="session")
def gqa_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random pair with grouped-query attention (fewer key/value heads than query heads)."""
    from starsd.tiny import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("gqa-pair"), seed=2, grouped_query=True)


@pytest.fixture(params=["mha", "gqa"])
def any_pair(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """The tiny random pair, then the grouped-query one: a test taking it runs on both."""
    name = "random_pair" if request.param == "mha" else "gqa_pair"
    pair: tuple[Path, Path] = request.getfixturevalue(name)
    return pair


@pytest.fixture(scope="session")
def mismatched_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A (draft, target) pair whose vocabularies differ."""
    from starsd.tiny import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("mismatched-pair"), seed=1, vocab_mismatch=True)


@pytest.fixture(scope="session")
def shipped_pair() -> tuple[Path, Path]:
    """The trained (draft, target) pair committed in models/."""
    from starsd.local import default_models_dir

    root = default_models_dir()
    for name in ("draft", "target"):
        assert (root / name / "config.json").is_file(), f"the shipped checkpoint {root / name} is missing"
    return root / "draft", root / "target"
