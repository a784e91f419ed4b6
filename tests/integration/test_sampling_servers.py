"""Through the real servers, sampled output follows the target's distribution, and seeds reproduce it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from starsd.checkpoints import load_checkpoint
from starsd.local import LocalStar, http_json
from starsd.tiny import write_random_pair
from tests.integration.conftest import start_star
from tests.stats import chi2_statistic, fits
from tests.support.gqa import write_gqa_pair
from tests.support.speculation import Decoding, PositionResult, binned, float64_model, position_tests

PROMPT = "def __init__(self"
TEMPERATURE = 1.0
SAMPLES = 3000  # per configuration: the first token's chi-square against the target's softmax, at 0.1 %
DISAGREEING_NOISE = 0.1  # the draft strays far from the target: total variation about 0.7 at this prompt


@pytest.fixture(scope="module")
def disagreeing_star(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    """Two targets and a draft that often proposes what the target would rarely say."""
    pair = write_random_pair(tmp_path_factory.mktemp("disagreeing"), seed=0, draft_noise=DISAGREEING_NOISE)
    star = start_star((pair.draft, pair.target), 2, tmp_path_factory.mktemp("disagreeing-star"))
    try:
        yield star
    finally:
        star.stop()


def _next_token_probs(checkpoint: Path, prompt: str) -> torch.Tensor:
    """The model's own distribution of the token after ``prompt`` at TEMPERATURE, straight from transformers."""
    loaded = load_checkpoint(checkpoint)
    ids = torch.tensor([loaded.tokenizer.encode(prompt)])
    with torch.inference_mode():
        logits = loaded.model(input_ids=ids).logits[0, -1].float()
    return torch.softmax(logits / TEMPERATURE, dim=-1)


def _first_tokens(star: LocalStar, eos: int) -> tuple[list[int], int]:
    """The first token of SAMPLES seeded completions (max_tokens 2: the draft proposes exactly one token)."""

    def first(seed: int) -> tuple[int, int]:
        body = {"prompt": PROMPT, "max_tokens": 2, "temperature": TEMPERATURE, "seed": seed}
        status, out = http_json(f"{star.urls[seed % len(star.urls)]}/v1/completions", body)
        assert status == 200, out
        return (out["starsd"]["token_ids"] or [eos])[0], out["starsd"]["drafted_tokens"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(first, range(SAMPLES)))
    return [t for t, _ in results], sum(d for _, d in results)


def _binned(tokens: list[int], p: torch.Tensor, bins: list[int]) -> tuple[list[int], list[float]]:
    """Counts and target probabilities over ``bins`` and one bin for every other token."""
    counts = [tokens.count(b) for b in bins]
    counts.append(len(tokens) - sum(counts))
    probs = [float(p[b]) for b in bins]
    probs.append(max(0.0, 1.0 - sum(probs)))
    return counts, probs


def test_first_sampled_token_follows_the_target_softmax_with_and_without_the_draft(
    disagreeing_star: LocalStar,
) -> None:
    star = disagreeing_star
    draft_dir, target_dir = (Path(a) for a in (star.draft_model, star.target_model))
    p = _next_token_probs(target_dir, PROMPT)
    q = _next_token_probs(draft_dir, PROMPT)
    assert float((p - q).abs().sum()) / 2 > 0.5  # the draft really disagrees: most proposals are rejected
    # The tokens either model favours, each its own bin: where a biased verifier would show.
    bins = sorted(set(p.topk(6).indices.tolist()) | set(q.topk(6).indices.tolist()))
    eos = load_checkpoint(target_dir).eos_token_id
    assert eos is not None

    tokens, drafted = _first_tokens(star, eos)
    assert drafted == SAMPLES  # every first token went through speculative verification
    counts, probs = _binned(tokens, p, bins)
    assert fits(counts, probs), f"with the draft: {chi2_statistic(counts, probs)}"

    star.kill_draft()  # the same requests, the targets decoding alone
    tokens, drafted = _first_tokens(star, eos)
    assert drafted == 0
    counts, probs = _binned(tokens, p, bins)
    assert fits(counts, probs), f"without the draft: {chi2_statistic(counts, probs)}"


def test_a_seed_reproduces_a_sampled_completion(star4: LocalStar) -> None:
    body = {"prompt": "for i in range(", "max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    first = http_json(f"{star4.urls[0]}/v1/completions", body)[1]
    again = http_json(f"{star4.urls[2]}/v1/completions", body)[1]
    assert first["starsd"]["token_ids"] == again["starsd"]["token_ids"]


def test_seed_zero_is_a_seed(star4: LocalStar) -> None:
    """proto3 sends 0 as 'unset': the seed's presence must travel explicitly, or the draft draws at random."""
    body = {"prompt": "import os\n", "max_tokens": 24, "temperature": 0.8, "seed": 0}
    runs = [http_json(f"{star4.urls[i % 4]}/v1/completions", body)[1] for i in range(3)]
    assert all(r["starsd"]["drafted_tokens"] > 0 for r in runs)
    assert runs[0]["choices"][0]["text"] == runs[1]["choices"][0]["text"] == runs[2]["choices"][0]["text"]


# --- every position of a gamma = 4 round, through HTTP -----------------------------------------------------

HTTP_GAMMA = 4
HTTP_SAMPLES = 4000  # completions of gamma + 1 tokens: chi-square per position at p = 1e-4, as below
HTTP_DECODING = Decoding(temperature=0.7, top_p=0.9, top_k=12)


@pytest.fixture(scope="module")
def gqa_star(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStar]:
    """One draft and two targets serving the small-vocabulary grouped-query pair, gamma 4."""
    pair = write_gqa_pair(tmp_path_factory.mktemp("gqa"), seed=0, draft_noise=0.1)
    star = start_star((pair.draft, pair.target), 2, tmp_path_factory.mktemp("gqa-star"), gamma=HTTP_GAMMA)
    try:
        yield star
    finally:
        star.stop()


def test_every_position_of_a_gamma_4_round_follows_the_target_through_http(gqa_star: LocalStar) -> None:
    """``HTTP_SAMPLES`` seeded completions of gamma + 1 tokens (top-p, top-k, temperature 0.7) from two targets,
    each position's token held to the target's exact float64 conditional given its prefix (the check of
    tests/test_sampling_positions.py).

    Power: at 4,000 completions a shift of 0.021 of probability between two bins of mass 0.1 at one position is
    caught with probability 0.8; false alarm at most 5e-4 (1e-4 per position). Negative control: the same
    completions held to the target at temperature 1.0 (a server that dropped the temperature) must fail.
    """
    star = gqa_star
    target_dir, draft_dir = Path(str(star.target_model)), Path(str(star.draft_model))
    prompt = load_checkpoint(target_dir).tokenizer.encode("x")
    body = {"prompt": prompt, "max_tokens": HTTP_GAMMA + 1, "ignore_eos": True, "temperature": 0.7, "top_p": 0.9}

    def complete(seed: int) -> tuple[list[int], int]:
        status, out = http_json(f"{star.urls[seed % 2]}/v1/completions", {**body, "top_k": 12, "seed": seed})
        assert status == 200, out
        return out["starsd"]["token_ids"], out["starsd"]["drafted_tokens"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(complete, range(HTTP_SAMPLES)))
    tokens = [t for t, _ in results]
    assert all(len(t) == HTTP_GAMMA + 1 for t in tokens)
    assert sum(d for _, d in results) >= HTTP_GAMMA * HTTP_SAMPLES  # every first round drafted gamma tokens
    target64, draft64 = float64_model(target_dir), float64_model(draft_dir)

    def check(decoding: Decoding) -> list[PositionResult]:
        bin_probs, seen, impossible = binned(target64, draft64, prompt, tokens, decoding)
        assert impossible == 0, f"{impossible} tokens the target gives probability 0"
        return position_tests(bin_probs, seen)

    results_ok = check(HTTP_DECODING)
    assert all(r.fits for r in results_ok), "\n".join(map(str, results_ok))
    wrong = check(Decoding(1.0, HTTP_DECODING.top_p, HTTP_DECODING.top_k))
    assert not all(r.fits for r in wrong), "\n".join(map(str, wrong))
