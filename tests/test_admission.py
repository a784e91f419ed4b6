"""Admission to the target: running completions x the longest one's reservation stays within the pool."""

from __future__ import annotations

import asyncio

import pytest

from starsd.verifier.scheduler import BudgetExceeded, KvBudget


def test_the_longest_reservation_sets_every_slot_so_a_long_completion_admits_fewer() -> None:
    async def run() -> list[str]:
        budget = KvBudget(max_num_seqs=8, kv_tokens=400)
        events: list[str] = []
        for _ in range(3):
            await budget.acquire(100)  # 3 x 100 <= 400
        assert budget.running == 3 and budget.reserved == 300

        async def admit(name: str, tokens: int) -> None:
            await budget.acquire(tokens)
            events.append(name)

        long = asyncio.create_task(admit("long", 200))  # 4 x 200 > 400: waits
        short = asyncio.create_task(admit("short", 10))  # behind it in line, though it would fit
        await asyncio.sleep(0.01)
        assert events == [] and budget.waiting == 2
        budget.release(100)  # 3 x 200 > 400: still waits
        await asyncio.sleep(0.01)
        assert events == []
        budget.release(100)  # 2 x 200 <= 400, then 3 x 200 > 400 for the short one
        await asyncio.sleep(0.01)
        assert events == ["long"] and budget.waiting == 1
        budget.release(200)
        await asyncio.gather(long, short)
        assert budget.running == 2 and budget.reserved == 200
        return events

    assert asyncio.run(run()) == ["long", "short"]


def test_a_completion_longer_than_the_whole_pool_is_refused_at_once() -> None:
    async def run() -> None:
        await KvBudget(max_num_seqs=8, kv_tokens=400).acquire(401)

    with pytest.raises(BudgetExceeded, match="whole budget is 400"):
        asyncio.run(run())
