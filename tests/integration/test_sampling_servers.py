"""Through the real servers, sampled output follows the target's distribution, and seeds reproduce it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from starsd.local import LocalStar, http_json
from starsd.runners import TargetRunner
from starsd.sampling import SamplingParams, logits_to_probs
from tests.integration.conftest import Reference
from tests.stats import chi2_statistic, fits

PROMPT = "def __init__(self"
TEMPERATURE = 1.0
SAMPLES = 600


def test_first_sampled_token_follows_the_target_distribution(star4: LocalStar, reference: Reference) -> None:
    ids = reference.encode(PROMPT)
    runner = TargetRunner(reference.model)
    logits = runner.score(runner.new_session(ids), [])[-1]
    p = logits_to_probs(logits, SamplingParams(temperature=TEMPERATURE))

    def first_token(seed: int) -> tuple[int, int]:
        body = {"prompt": PROMPT, "max_tokens": 3, "temperature": TEMPERATURE, "seed": seed}
        status, out = http_json(f"{star4.urls[seed % 4]}/v1/completions", body)
        assert status == 200, out
        return out["starsd"]["token_ids"][0], out["starsd"]["drafted_tokens"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(first_token, range(SAMPLES)))
    assert sum(d for _, d in results) > 0  # the first token went through speculative verification
    counts = torch.bincount(torch.tensor([t for t, _ in results]), minlength=p.shape[0]).tolist()
    assert fits(counts, p.tolist()), chi2_statistic(counts, p.tolist())


def test_a_seed_reproduces_a_sampled_completion(star4: LocalStar) -> None:
    body = {"prompt": "for i in range(", "max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    first = http_json(f"{star4.urls[0]}/v1/completions", body)[1]
    again = http_json(f"{star4.urls[2]}/v1/completions", body)[1]
    assert first["starsd"]["token_ids"] == again["starsd"]["token_ids"]
