"""The tiny random pairs for tests (starsd.tiny) and vocabulary fingerprints (starsd.vocab)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from starsd.cli import main as cli_main
from starsd.tiny import ModelPair, write_random_pair
from starsd.training.acceptance import model_functions, speculative_greedy
from starsd.vocab import VocabMismatchError, require_shared_vocab, vocab_fingerprint


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> ModelPair:
    return write_random_pair(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory: pytest.TempPathFactory) -> ModelPair:
    return write_random_pair(tmp_path_factory.mktemp("tiny-mismatch"), seed=0, vocab_mismatch=True)


def load(path: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()


def test_random_pair_is_two_complete_checkpoints(pair: ModelPair) -> None:
    assert pair.draft.name == "draft" and pair.target.name == "target"
    for path in pair:
        for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
            assert (path / name).is_file(), f"{path / name} missing"
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == "llama"
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = load(path)
        assert model.config.vocab_size == len(tokenizer)
        assert tokenizer.bos_token_id is not None and tokenizer.eos_token_id is not None


def test_random_pair_shares_one_vocabulary(pair: ModelPair) -> None:
    assert vocab_fingerprint(pair.draft) == vocab_fingerprint(pair.target)
    assert require_shared_vocab(pair.draft, pair.target) == vocab_fingerprint(pair.target)


def test_vocab_mismatch_gives_the_draft_another_vocabulary(mismatched: ModelPair) -> None:
    draft_tok = AutoTokenizer.from_pretrained(str(mismatched.draft), local_files_only=True)
    target_tok = AutoTokenizer.from_pretrained(str(mismatched.target), local_files_only=True)
    assert len(draft_tok) != len(target_tok)
    assert load(mismatched.draft).config.vocab_size != load(mismatched.target).config.vocab_size
    assert vocab_fingerprint(mismatched.draft) != vocab_fingerprint(mismatched.target)
    with pytest.raises(VocabMismatchError, match="do not share a vocabulary"):
        require_shared_vocab(mismatched.draft, mismatched.target)


def test_same_seed_same_weights_other_seed_other_weights(pair: ModelPair, tmp_path: Path) -> None:
    again = write_random_pair(tmp_path / "again", seed=0)
    other = write_random_pair(tmp_path / "other", seed=1)
    for name in ("draft", "target"):
        a = load_file(str(getattr(pair, name) / "model.safetensors"))
        b = load_file(str(getattr(again, name) / "model.safetensors"))
        c = load_file(str(getattr(other, name) / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert not all(torch.equal(a[k], c[k]) for k in a)


def test_rewriting_a_pair_replaces_it(tmp_path: Path) -> None:
    write_random_pair(tmp_path, seed=0, vocab_mismatch=True)
    pair = write_random_pair(tmp_path, seed=0)
    assert vocab_fingerprint(pair.draft) == vocab_fingerprint(pair.target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "target"]


def test_random_pair_exercises_both_accepting_and_rejecting(pair: ModelPair) -> None:
    # A useful test pair: greedy output depends on the context (not one repeated token), and the draft is
    # accepted sometimes but not always, so servers see accepted, rejected and bonus tokens.
    draft, target = load(pair.draft), load(pair.target)
    propose, verify = model_functions(draft, target)
    gen = torch.Generator().manual_seed(0)
    accepted, drafted, full_rounds, zero_rounds = 0, 0, 0, 0
    for _ in range(4):
        prompt = torch.randint(3, target.config.vocab_size, (6,), generator=gen).tolist()
        out, stats = speculative_greedy(prompt, 32, 4, propose, verify)
        assert len(set(out)) > 8
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
        full_rounds += stats.accepted_lengths.count(4)
        zero_rounds += stats.accepted_lengths.count(0)
    assert 0.1 < accepted / drafted < 0.95
    assert full_rounds > 0 and zero_rounds > 0


def test_fingerprint_is_the_same_for_a_tokenizer_and_its_directory(pair: ModelPair) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(pair.target), local_files_only=True)
    fp = vocab_fingerprint(tokenizer)
    assert fp == vocab_fingerprint(pair.target) == vocab_fingerprint(str(pair.target))
    assert len(fp) == 64 and int(fp, 16) >= 0


def test_fingerprint_changes_with_the_vocabulary_or_special_tokens(pair: ModelPair) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(pair.target), local_files_only=True)
    before = vocab_fingerprint(tokenizer)
    tokenizer.add_tokens(["<|new|>"])
    assert vocab_fingerprint(tokenizer) != before
    other = AutoTokenizer.from_pretrained(str(pair.target), local_files_only=True)
    other.eos_token = other.pad_token
    assert vocab_fingerprint(other) != before


def test_models_tiny_command_writes_a_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["models", "tiny", "--out", str(tmp_path), "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert str(tmp_path / "draft") in printed and str(tmp_path / "target") in printed
    assert vocab_fingerprint(tmp_path / "draft") == vocab_fingerprint(tmp_path / "target")
    assert cli_main(["models", "tiny", "--out", str(tmp_path / "m"), "--vocab-mismatch"]) == 0
    assert vocab_fingerprint(tmp_path / "m" / "draft") != vocab_fingerprint(tmp_path / "m" / "target")
