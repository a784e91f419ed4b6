"""The step scheduler batches every session that is ready, including the ones the last step just woke."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from starsd.target.scheduler import StepScheduler


def test_sessions_woken_by_a_step_all_run_in_the_next_one() -> None:
    """Sixteen sessions loop round after round; each step's end wakes all of them, and the next step takes them
    all, rather than starting with whichever resumes first and leaving the rest for the step after."""
    steps: list[int] = []

    def run_step(rows: list[int]) -> list[int]:
        steps.append(len(rows))
        return rows

    async def run() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            scheduler: StepScheduler[int, int] = StepScheduler(run_step, executor, 64, 1024)

            async def session(i: int) -> None:
                for _ in range(10):
                    assert await scheduler.run(i, cost=1) == i

            await asyncio.gather(*(session(i) for i in range(16)))

    asyncio.run(run())
    assert steps == [16] * 10


def test_a_step_takes_at_most_max_num_seqs_rows_and_the_rest_run_next() -> None:
    steps: list[list[int]] = []

    def run_step(rows: list[int]) -> list[int]:
        steps.append(rows)
        return [r * 10 for r in rows]

    async def run() -> list[int]:
        with ThreadPoolExecutor(max_workers=1) as executor:
            scheduler: StepScheduler[int, int] = StepScheduler(run_step, executor, 4, 1024)
            return list(await asyncio.gather(*(scheduler.run(i, cost=1) for i in range(6))))

    assert asyncio.run(run()) == [0, 10, 20, 30, 40, 50]
    assert steps == [[0, 1, 2, 3], [4, 5]]
