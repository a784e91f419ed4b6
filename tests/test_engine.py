"""The target's generation loop on a real (tiny) model, without servers: EOS handling and ignore_eos."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from starsd.checkpoints import load_checkpoint
from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import Limits, parse_completion
from starsd.sampling import SamplingParams
from starsd.verifier.engine import GenerationStats, RequestControls, TargetEngine
from tests.support.reference import autoregressive_reference

PROMPT = [5, 17, 42, 7, 99]


async def _generate(engine: TargetEngine, max_tokens: int, ignore_eos: bool) -> GenerationStats:
    stats, controls = GenerationStats(), RequestControls(ignore_eos=ignore_eos)
    async for _ in engine.generate(PROMPT, max_tokens, SamplingParams(), stats, controls=controls):
        pass
    return stats


def test_eos_ends_a_completion_unless_ignore_eos(random_pair: tuple[Path, Path]) -> None:
    target = load_checkpoint(random_pair[1])
    greedy = autoregressive_reference(dataclasses.replace(target, eos_token_id=None), PROMPT, 12)
    eos = greedy[3]  # pretend the 4th greedy token is the end of sequence
    cut = greedy.index(eos)
    engine = TargetEngine(dataclasses.replace(target, eos_token_id=eos), draft=None)
    try:
        stopped = asyncio.run(_generate(engine, 12, ignore_eos=False))
        assert stopped.token_ids == greedy[:cut] and stopped.finish_reason == "stop"
        ignored = asyncio.run(_generate(engine, 12, ignore_eos=True))
        assert ignored.token_ids == greedy and ignored.finish_reason == "length"
    finally:
        engine.close()


def test_ignore_eos_must_be_a_boolean() -> None:
    limits = Limits(vocab_size=100, max_context=64)
    assert parse_completion({"prompt": "x", "ignore_eos": True}, limits, ("m",)).ignore_eos
    try:
        parse_completion({"prompt": "x", "ignore_eos": "yes"}, limits, ("m",))
    except RequestError as err:
        assert err.param == "ignore_eos"
    else:
        raise AssertionError("a non-boolean ignore_eos was accepted")
