"""The step scheduler batches every session that is ready, including the ones the last step just woke."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from starsd.verifier.scheduler import StepScheduler


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


def _gathering_run(arrive_after: float, max_gather: float, cohorts: tuple[int, int] = (1, 1)) -> list[list[str]]:
    """A warm-up step, then row ``a`` (cohort 1, the warm-up step's) is ready while rows ``b`` and ``c`` (of
    ``cohorts``) are on their way (their sessions await their draft proposals) and arrive ``arrive_after``
    seconds later. Returns the rows of each step."""
    steps: list[list[str]] = []

    def run_step(rows: list[str]) -> list[str]:
        steps.append(rows)
        time.sleep(0.05)  # one step's time: how long ready rows may wait for their cohort
        return rows

    async def run() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            scheduler: StepScheduler[str, str] = StepScheduler(
                run_step, executor, 64, 1024, max_gather_seconds=max_gather
            )
            await scheduler.run("warm-up", cost=1)
            assert scheduler.finished_steps == 1

            async def later(row: str, cohort: int) -> str:
                with scheduler.expect(cohort):
                    await asyncio.sleep(arrive_after)  # the draft's round trip
                return await scheduler.run(row, cost=1, cohort=cohort)

            calls = [later("b", cohorts[0]), later("c", cohorts[1])]  # announced first
            await asyncio.gather(*calls, scheduler.run("a", cost=1, cohort=1))

    asyncio.run(run())
    return steps


def test_ready_rows_wait_for_their_cohort_whose_proposals_are_on_their_way() -> None:
    """Starting with ``a`` alone would spend a step on one row and another on ``b`` and ``c``."""
    assert _gathering_run(arrive_after=0.005, max_gather=10.0) == [["warm-up"], ["a", "b", "c"]]


def test_ready_rows_do_not_wait_for_other_cohorts() -> None:
    """Rows of another cohort went to the draft later: the model verifies ``a`` while the draft drafts for them."""
    assert _gathering_run(arrive_after=0.005, max_gather=10.0, cohorts=(2, 2)) == [["warm-up"], ["a"], ["b", "c"]]


def test_the_wait_for_a_cohort_is_bounded() -> None:
    """Rows that arrive long after (a slow draft) do not hold the ready ones past about one step's time."""
    assert _gathering_run(arrive_after=1.0, max_gather=10.0) == [["warm-up"], ["a"], ["b", "c"]]
    assert _gathering_run(arrive_after=0.005, max_gather=0.0) == [["warm-up"], ["a"], ["b", "c"]]
