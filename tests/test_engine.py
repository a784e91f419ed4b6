"""The target's generation loop on a real (tiny) model, without servers: EOS handling and ignore_eos."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

from starsd.checkpoints import load_checkpoint
from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import Limits, parse_completion
from starsd.sampling import SamplingParams
from starsd.verifier.engine import GenerationStats, RequestControls, TargetEngine
from starsd.verifier.runner import TargetRunner
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


def test_a_completion_cancelled_during_its_step_leaves_the_others_in_that_step_unharmed(
    random_pair: tuple[Path, Path],
) -> None:
    """A client that leaves cancels its completion while its row may be in a step on the model thread: the slot
    that step is using stays its own until the step ends, and the other rows of the step finish as before."""
    target = load_checkpoint(random_pair[1])
    engine = TargetEngine(target, draft=None)
    runner = engine.runner
    assert isinstance(runner, TargetRunner)
    expected = autoregressive_reference(target, PROMPT, 6)
    in_step, resume = threading.Event(), threading.Event()
    real_step_cache = runner.pool.step_cache

    def held_step_cache(*args: Any, **kwargs: Any) -> Any:
        in_step.set()
        assert resume.wait(30), "the test never resumed the step"
        return real_step_cache(*args, **kwargs)

    async def scenario() -> GenerationStats:
        loop = asyncio.get_running_loop()
        leaving = asyncio.create_task(_generate(engine, 6, ignore_eos=True))
        staying = asyncio.create_task(_generate(engine, 6, ignore_eos=True))
        await asyncio.sleep(0.05)  # both rows are queued for the first step, which the model thread now runs
        assert await loop.run_in_executor(None, in_step.wait, 30)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)  # its generation's cleanup has run
        resume.set()
        return await staying

    runner.pool.step_cache = held_step_cache  # type: ignore[method-assign]
    try:
        staying = asyncio.run(scenario())
        assert staying.token_ids == expected
        engine.executor.submit(lambda: None).result(30)  # whatever the model thread had queued has run
        assert runner.pool.used == 0  # and both slots are back
    finally:
        resume.set()
        engine.close()
