"""Training the shipped pair (starsd.training): tokenizer, data order, loops, acceptance, shipped checkpoints."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from starsd.tiny import shipped_pair
from starsd.training.acceptance import ProposeFn, VerifyFn, accepted_prefix, model_functions, speculative_greedy
from starsd.training.configs import ModelSpec, build_model, count_parameters
from starsd.training.corpus import is_held_out, load_corpus
from starsd.training.data import cycled_batches, joined_batches, token_stream, window_batches
from starsd.training.loop import (
    DistillWeights,
    TrainConfig,
    distill,
    generate_greedy,
    lr_at,
    project_embeddings,
    train_language_model,
)
from starsd.training.tokenizer import BOS, EOS, encode_documents, save_tokenizer, train_bpe
from starsd.vocab import vocab_fingerprint

SAMPLE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n\tprint(i)  # tabs and comments\n",
    "s = 'héllo wörld ✓ 数字'\n",
] * 5

MICRO = ModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=64)


# -- tokenizer ---------------------------------------------------------------------------------------------


def test_tokenizer_round_trips_any_text_and_prepends_bos(tmp_path: Path) -> None:
    tok = train_bpe(SAMPLE, vocab_size=300)
    save_tokenizer(tok, tmp_path, model_max_length=64)
    hf = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    for text in [*SAMPLE, "", "  leading spaces\n\n\n", "unseen: ∑ 🙂 \x00 \r\n", "x" * 300]:
        ids = hf(text)["input_ids"]
        assert ids[0] == hf.bos_token_id == tok.token_to_id(BOS)
        assert hf.decode(ids, skip_special_tokens=True) == text
        assert tok.decode(tok.encode(text).ids) == text
    assert hf.eos_token == EOS and hf.pad_token is not None


def test_tokenizer_training_is_deterministic() -> None:
    a = train_bpe(SAMPLE, vocab_size=300)
    b = train_bpe(SAMPLE, vocab_size=300)
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size() == 300
    assert train_bpe(SAMPLE[:2], vocab_size=300).to_str() != a.to_str()


def test_tokenizer_refuses_a_vocabulary_smaller_than_bytes() -> None:
    with pytest.raises(ValueError, match="byte alphabet"):
        train_bpe(SAMPLE, vocab_size=100)


def test_documents_are_wrapped_in_bos_and_eos() -> None:
    tok = train_bpe(SAMPLE, vocab_size=300)
    docs = encode_documents(tok, SAMPLE[:2])
    assert all(d[0] == tok.token_to_id(BOS) and d[-1] == tok.token_to_id(EOS) for d in docs)
    assert token_stream(docs).tolist() == docs[0] + docs[1]


# -- corpus and data order -----------------------------------------------------------------------------------


def test_held_out_split_depends_only_on_the_file_name() -> None:
    names = [f"pkg/module_{i}.py" for i in range(400)]
    held = [n for n in names if is_held_out(n)]
    assert held == [n for n in reversed(names) if is_held_out(n)][::-1]
    assert 5 <= len(held) <= 40  # about 1 in 20


def test_corpus_is_sorted_and_excludes_tests_and_site_packages() -> None:
    corpus = load_corpus(limit=50)
    names = [d.name for d in (*corpus.train, *corpus.held_out)]
    assert [d.name for d in corpus.train] == sorted(d.name for d in corpus.train)
    assert not any(part in {"test", "tests", "site-packages"} for n in names for part in n.split("/")[:-1])
    assert all(not is_held_out(d.name) for d in corpus.train)
    assert load_corpus(limit=50).fingerprint() == corpus.fingerprint()


def test_batches_are_fixed_by_the_seed() -> None:
    stream = np.arange(1000)
    a = list(window_batches(stream, seq_len=16, batch_size=4, steps=3, seed=5))
    b = list(window_batches(stream, seq_len=16, batch_size=4, steps=3, seed=5))
    c = list(window_batches(stream, seq_len=16, batch_size=4, steps=3, seed=6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    assert a[0].shape == (4, 17)
    # Windows are contiguous slices of the stream.
    assert all(torch.equal(w[1:] - w[:-1], torch.ones(16, dtype=w.dtype)) for w in a[0])


def test_cycled_batches_visit_every_row_once_per_pass() -> None:
    rows = torch.arange(10).unsqueeze(1).repeat(1, 3)  # [10, 3]
    batches = list(cycled_batches(rows, batch_size=2, steps=10, seed=0))
    assert len(batches) == 10
    first_pass = torch.cat(batches[:5])[:, 0].sort().values
    assert torch.equal(first_pass, torch.arange(10))
    again = list(cycled_batches(rows, batch_size=2, steps=10, seed=0))
    assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))
    joined = next(joined_batches(iter(batches), iter(again)))
    assert joined.shape == (4, 3)


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    cfg = TrainConfig(steps=100, batch_size=1, seq_len=8, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(99, cfg) == pytest.approx(1e-4)
    rates = [lr_at(i, cfg) for i in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(rates))


# -- training loops ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_stream() -> tuple[np.ndarray, int]:
    """Tokens of the first few standard library files, with a small tokenizer."""
    corpus = load_corpus(limit=8)
    texts = [d.text for d in corpus.train]
    tok = train_bpe(texts, vocab_size=320)
    return token_stream(encode_documents(tok, texts)), tok.get_vocab_size()


def micro_model(vocab: int, seed: int, spec: ModelSpec = MICRO) -> Any:
    torch.manual_seed(seed)
    return build_model(spec, vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2)


CFG = TrainConfig(steps=30, batch_size=4, seq_len=32, lr=1e-2, warmup_steps=3)


def test_language_model_training_reduces_the_loss_and_is_deterministic(small_stream: tuple[np.ndarray, int]) -> None:
    stream, vocab = small_stream
    a, b = micro_model(vocab, seed=0), micro_model(vocab, seed=0)
    losses_a = train_language_model(a, stream, CFG, progress=False)
    losses_b = train_language_model(b, stream, CFG, progress=False)
    assert np.mean(losses_a[-5:]) < np.mean(losses_a[:5]) - 0.5
    assert losses_a == losses_b
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = micro_model(vocab, seed=0)
    train_language_model(c, stream, TrainConfig(**{**CFG.to_dict(), "seed": 1}), progress=False)
    assert not all(torch.equal(sa[k], c.state_dict()[k]) for k in sa)


def test_distillation_pulls_the_draft_towards_the_target(small_stream: tuple[np.ndarray, int]) -> None:
    stream, vocab = small_stream
    teacher = micro_model(vocab, seed=0)
    train_language_model(teacher, stream, CFG, progress=False)
    spec = ModelSpec(hidden_size=16, num_layers=1, num_heads=1, intermediate_size=32, max_position_embeddings=64)
    s1, s2 = micro_model(vocab, seed=1, spec=spec), micro_model(vocab, seed=1, spec=spec)
    weights = DistillWeights(kl=1.0, hard=0.5)

    def batches() -> Iterator[torch.Tensor]:
        return window_batches(stream, CFG.seq_len, CFG.batch_size, CFG.steps, CFG.seed)

    losses = distill(s1, teacher, batches(), CFG, weights, progress=False)
    assert len(losses) == CFG.steps
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert distill(s2, teacher, batches(), CFG, weights, progress=False) == losses
    assert count_parameters(s1) < count_parameters(teacher)


def test_projected_embeddings_keep_the_targets_geometry() -> None:
    teacher, same = micro_model(320, seed=0), micro_model(320, seed=1)
    project_embeddings(teacher, same)  # same width: a rotation, inner products are kept
    e_t, e_s = teacher.get_input_embeddings().weight, same.get_input_embeddings().weight
    assert torch.allclose(e_s @ e_s.T, e_t @ e_t.T, atol=1e-5)
    narrow = micro_model(320, seed=1, spec=ModelSpec(16, 1, 1, 32, 64))
    before = narrow.get_input_embeddings().weight.clone()
    project_embeddings(teacher, narrow)
    after = narrow.get_input_embeddings().weight
    assert after.shape == before.shape and not torch.equal(after, before)
    assert narrow.get_output_embeddings().weight is after  # still tied
    with pytest.raises(ValueError, match="vocabularies differ"):
        project_embeddings(teacher, micro_model(400, seed=0))


# -- acceptance ----------------------------------------------------------------------------------------------


def counting_target(context: Sequence[int]) -> int:
    """The hand-made target: the next token is the last one plus one, modulo 10."""
    return (context[-1] + 1) % 10


def hand_made_pair(wrong_after: set[int]) -> tuple[ProposeFn, VerifyFn]:
    """A draft that follows the target's rule except right after a token in ``wrong_after``, where it proposes
    -1 (a token the target never produces)."""

    def draft_next(context: Sequence[int]) -> int:
        return -1 if context[-1] in wrong_after else counting_target(context)

    def propose(context: Sequence[int], gamma: int) -> list[int]:
        seq = list(context)
        for _ in range(gamma):
            seq.append(draft_next(seq))
        return seq[len(context) :]

    def verify(context: Sequence[int], drafts: Sequence[int]) -> list[int]:
        seq = [*context, *drafts]
        return [counting_target(seq[: len(context) + i]) for i in range(len(drafts) + 1)]

    return propose, verify


def test_accepted_prefix_stops_at_the_first_disagreement() -> None:
    assert accepted_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5]) == 4
    assert accepted_prefix([1, 2, 7, 4], [1, 2, 3, 4, 5]) == 2
    assert accepted_prefix([0, 2, 3, 4], [1, 2, 3, 4, 5]) == 0


def test_speculative_rounds_are_counted_by_hand() -> None:
    # The draft goes wrong after a 3 (it says -1 instead of 4). From [0], gamma=4, 10 new tokens:
    #   round 1: drafts 1 2 3 -1 | target 1 2 3 4 -> l=3, commits 1 2 3 4
    #   round 2: drafts 5 6 7 8 | all agree      -> l=4, commits 5 6 7 8 + bonus 9
    #   round 3: drafts 0 1 2 3 | all agree      -> l=4, commits 0 (budget of 10 reached)
    propose, verify = hand_made_pair(wrong_after={3})
    out, stats = speculative_greedy([0], 10, 4, propose, verify)
    assert out == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
    assert stats.accepted_lengths == [3, 4, 4]
    assert (stats.rounds, stats.drafted, stats.accepted, stats.generated) == (3, 12, 11, 10)
    assert stats.per_token_acceptance == pytest.approx(11 / 12)
    assert stats.mean_accepted_length == pytest.approx(11 / 3)


def test_a_draft_that_is_always_wrong_still_yields_the_target_text() -> None:
    propose, verify = hand_made_pair(wrong_after=set(range(10)))
    out, stats = speculative_greedy([5], 6, 4, propose, verify)
    assert out == [6, 7, 8, 9, 0, 1]
    assert stats.accepted_lengths == [0] * 6 and stats.per_token_acceptance == 0.0
    with pytest.raises(ValueError, match="gamma"):
        speculative_greedy([5], 6, 0, propose, verify)


def test_generation_stops_at_eos() -> None:
    propose, verify = hand_made_pair(wrong_after=set())
    out, stats = speculative_greedy([0], 50, 4, propose, verify, eos_token_id=7)
    assert out == [1, 2, 3, 4, 5, 6, 7]
    assert stats.generated == 7 and stats.rounds == 2


def test_greedy_continuations_are_the_models_own_text(small_stream: tuple[np.ndarray, int]) -> None:
    stream, vocab = small_stream
    model = micro_model(vocab, seed=0)
    prompts = torch.from_numpy(stream[:12]).reshape(2, 6)
    out = generate_greedy(model, prompts, new_tokens=5, batch_size=1, progress=False)
    assert out.shape == (2, 11) and torch.equal(out[:, :6], prompts)
    _propose, verify = model_functions(model, model)
    for row in out.tolist():
        assert verify(row[:6], row[6:10]) == row[6:11]


def test_model_rounds_commit_exactly_the_targets_greedy_text(small_stream: tuple[np.ndarray, int]) -> None:
    stream, vocab = small_stream
    target, draft = micro_model(vocab, seed=0), micro_model(vocab, seed=1)
    train_language_model(target, stream, CFG, progress=False)
    propose, verify = model_functions(draft, target)
    prompt = stream[:12].tolist()
    out, _ = speculative_greedy(prompt, 20, 4, propose, verify)
    reference = target.generate(
        torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=2
    )
    assert out == reference[0, len(prompt) :].tolist()


# -- the shipped checkpoints ---------------------------------------------------------------------------------


def test_shipped_pair_loads_offline_and_shares_one_tokenizer() -> None:
    pair = shipped_pair()
    models, tokenizers = {}, {}
    for name in ("draft", "target"):
        path = getattr(pair, name)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
            assert (path / f).is_file(), f"{path / f} missing"
        models[name] = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        tokenizers[name] = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        config = models[name].config
        assert config.model_type == "llama" and config.tie_word_embeddings
        assert config.vocab_size == len(tokenizers[name])
        assert next(models[name].parameters()).dtype == torch.float32
    assert vocab_fingerprint(tokenizers["draft"]) == vocab_fingerprint(tokenizers["target"])
    ratio = count_parameters(models["target"]) / count_parameters(models["draft"])
    assert 5 < ratio < 20
    assert 1_000_000 < count_parameters(models["target"]) < 10_000_000


def test_shipped_report_records_the_acceptance_goal() -> None:
    report = json.loads((shipped_pair().target.parent / "report.json").read_text())
    assert report["evaluation"]["gamma"] == 4
    assert report["evaluation"]["per_token_acceptance"] >= 0.6
