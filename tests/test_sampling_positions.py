"""Sampled speculative decoding is exact at every position of a round, through the real draft and target runners.

A completion of ``gamma + 1`` tokens per request seed runs through :class:`DraftRunner` and :class:`TargetRunner`
with the servers' seeding (see :mod:`tests.support.speculation`) on a grouped-query-attention pair whose
vocabulary is small (:mod:`tests.support.gqa`). The first round's positions ``2..gamma`` are where the draft's
per-position distributions from its cache, acceptance after an accepted prefix, the residual after a later
rejection and the bonus token all matter; each position's token is held to the target's exact conditional
probabilities given the completion's own prefix (transformers in float64, with the request's top-k,
temperature and top-p written out independently).

Statistics, for every test here (``SAMPLES`` = 8,192 completions, bins as in
:func:`tests.support.speculation.position_tests`, chi-square at p = 1e-4 per position):

* false alarm: at most 1e-4 per position (measured 0.6e-4 to 1.3e-4 for the Wilson-Hilferty limits at 1 to 7
  degrees of freedom, 200,000 simulated draws), so at most 3e-4 for gamma = 2 and 5e-4 for gamma = 4; the seeds
  are fixed, so a run's result is reproducible;
* power: a noncentrality of 34 is detected with probability 0.8 (7 degrees of freedom; less with fewer), which
  is a shift of 0.014 of probability between two bins of mass 0.1 at any one position (0.010 between bins of
  0.05, 0.017 between bins of 0.3 and 0.1), averaged over the completions;
* each test has a negative control: the same check with a verifier bug injected into the pure verification
  function (:func:`starsd.sampling.verify_batch` as the target's runner calls it) must fail at the bug's
  position. Measured (chi-square at the bug's position, limit 30.4; the correct runs' largest is 12.2):
  skipping the residual at position 2 (gamma 2, T 1.0) 478; reusing position 1's uniform at position 2
  (gamma 2, T 0.7) 112 and (gamma 4, T 1.0) 200; skipping the residual at position 4 (gamma 4, T 0.7) 96.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from starsd.checkpoints import LoadedModel, load_checkpoint
from starsd.verifier import runner as target_runner
from tests.support.gqa import write_gqa_pair
from tests.support.speculation import (
    Completions,
    Decoding,
    PositionResult,
    binned,
    exact_probs,
    float64_model,
    position_tests,
    sample_completions,
)

SAMPLES = 8192
DRAFT_NOISE = 0.1  # the draft accepts about 0.8 per position: every position of a round is reached and rejected
PROMPT = "x"
TOP_P = 0.9
TOP_K = 12  # of the pair's 32 tokens
MIN_SHARE = 0.03  # of the completions, at least this many end their first round at each accepted count

VerifyBatch = Callable[..., Any]


class Pair:
    def __init__(self, root: Path) -> None:
        paths = write_gqa_pair(root, seed=0, draft_noise=DRAFT_NOISE)
        self.draft: LoadedModel = load_checkpoint(paths.draft)
        self.target: LoadedModel = load_checkpoint(paths.target)
        self.draft64 = float64_model(paths.draft)
        self.target64 = float64_model(paths.target)
        self.prompt: list[int] = self.target.tokenizer.encode(PROMPT)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    return Pair(tmp_path_factory.mktemp("gqa-pair"))


def run(pair: Pair, gamma: int, decoding: Decoding) -> tuple[Completions, list[PositionResult]]:
    completions = sample_completions(pair.draft, pair.target, pair.prompt, gamma + 1, gamma, decoding, range(SAMPLES))
    bin_probs, seen, impossible = binned(pair.target64, pair.draft64, pair.prompt, completions.tokens, decoding)
    assert impossible == 0, f"{impossible} tokens drawn that the target gives probability 0 (top-k, top-p)"
    return completions, position_tests(bin_probs, seen)


# --- verifier bugs the check must see ---------------------------------------------------------------------


def skips_the_residual_at(position: int, real: VerifyBatch) -> VerifyBatch:
    """A verifier that, after a rejection at ``position`` (1-based), draws from p instead of norm(max(p - q, 0))."""

    def verify_batch(drafts, gammas, draft_probs, target_probs, uniforms, races):  # type: ignore[no-untyped-def]
        verdict = real(drafts, gammas, draft_probs, target_probs, uniforms, races)
        if drafts.shape[1] < position:
            return verdict
        rejected_here = (verdict.accepted == position - 1) & (gammas >= position)
        from_p = (target_probs[:, position - 1] / races).argmax(dim=-1)
        return type(verdict)(accepted=verdict.accepted, last=torch.where(rejected_here, from_p, verdict.last))

    return verify_batch


def reuses_the_uniform_at(position: int, real: VerifyBatch) -> VerifyBatch:
    """A verifier that accepts the draft at ``position`` with the uniform of the position before it."""

    def verify_batch(drafts, gammas, draft_probs, target_probs, uniforms, races):  # type: ignore[no-untyped-def]
        if uniforms.shape[1] >= position:
            uniforms = uniforms.clone()
            uniforms[:, position - 1] = uniforms[:, position - 2]
        return real(drafts, gammas, draft_probs, target_probs, uniforms, races)

    return verify_batch


BUGS = {"skips the residual at": skips_the_residual_at, "reuses the uniform at": reuses_the_uniform_at}

# (gamma, temperature, the control's bug, at which position)
CASES = [
    (2, 1.0, "skips the residual at", 2),
    (2, 0.7, "reuses the uniform at", 2),
    (4, 1.0, "reuses the uniform at", 2),
    (4, 0.7, "skips the residual at", 4),
]


@pytest.mark.parametrize(("gamma", "temperature"), [c[:2] for c in CASES])
def test_every_position_of_a_round_follows_the_target(pair: Pair, gamma: int, temperature: float) -> None:
    decoding = Decoding(temperature, TOP_P, TOP_K)
    completions, results = run(pair, gamma, decoding)
    # The rounds really reached every position: each accepted count 0..gamma ends enough first rounds.
    accepted = Counter(a for drafted, a in completions.first_round if drafted == gamma)
    assert sum(accepted.values()) == SAMPLES
    assert all(accepted[k] >= MIN_SHARE * SAMPLES for k in range(gamma + 1)), accepted
    assert all(r.fits for r in results), "\n".join(map(str, results))


@pytest.mark.parametrize(("gamma", "temperature", "bug", "position"), CASES)
def test_the_check_fails_a_verifier_bug(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, gamma: int, temperature: float, bug: str, position: int
) -> None:
    """The negative control of the test above with the same configuration: a bug at ``position`` must fail it."""
    monkeypatch.setattr(target_runner, "verify_batch", BUGS[bug](position, target_runner.verify_batch))
    _, results = run(pair, gamma, Decoding(temperature, TOP_P, TOP_K))
    assert not results[position - 1].fits, str(results[position - 1])
    assert all(r.fits for r in results[: position - 1]), "\n".join(map(str, results))  # earlier positions: intact


def test_top_k_and_top_p_really_cut_the_target_distribution(pair: Pair) -> None:
    """The configuration above exercises both truncations: at the prompt, top-k and top-p each remove mass."""
    with torch.no_grad():
        logits = pair.target64(input_ids=torch.tensor([pair.prompt])).logits[0, -1]
    full = exact_probs(logits, Decoding(1.0))
    assert int((full > 0).sum()) > TOP_K
    cut = exact_probs(logits, Decoding(1.0, TOP_P, TOP_K))
    assert 0 < int((cut > 0).sum()) < TOP_K
