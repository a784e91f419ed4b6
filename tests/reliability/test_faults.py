"""Faults injected while clients keep the star busy: no request is lost, greedy output stays the target's.

* the draft SIGKILLed and restarted at seeded random moments (targets decode alone meanwhile, then draft again);
* the draft link cut (connections reset, processes alive): targets reconnect;
* a target SIGKILLed: its sessions on the draft are freed, the other targets do not notice;
* a slow link (delay through the fault proxy beyond the targets' --draft-timeout): targets fall back to decoding
  alone, and draft again once the delay is gone.

Each test prints its figures and writes them to bench/results/reliability-<name>.json.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.integration.conftest import PROMPTS, Reference
from tests.reliability import workload
from tests.reliability.conftest import (
    DRAFT_TIMEOUT,
    START_TIMEOUT,
    ProxiedStar,
    Target,
    draft_load,
    draft_metrics,
    draft_sessions,
    long_greedy_prompts,
    soak_only,
    start_target,
    wait_linked,
    wait_sessions_freed,
)
from tests.reliability.test_load import MAX_TOKENS, greedy_mismatches, prime_oracle
from tests.reliability.workload import HeldStream, Outcome, Workload
from tests.support.faults import ThreadedFaultProxy

RUN_CAP = 900.0  # seconds: the most any faulted load may run (the faults end it much earlier)


def run_with_faults(
    star: ProxiedStar,
    seed: int,
    inject: Callable[[random.Random], dict[str, Any]],
    clients: int = 8,
    think: float = 0.0,
) -> tuple[list[Outcome], dict[str, Any], float]:
    """Run a load on the star's targets while ``inject`` does its harm from this thread; the load stops when
    ``inject`` returns. Returns the outcomes, what ``inject`` reports, and the wall time."""
    stop = threading.Event()
    work = Workload(
        star.urls,
        PROMPTS,
        clients=clients,
        duration=RUN_CAP,
        max_requests=100_000,
        max_tokens=MAX_TOKENS,
        seed=seed,
        until=stop,
        think=think,
    )
    start = time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="load") as pool:
        future = pool.submit(workload.run, work)
        try:
            injected = inject(random.Random(seed))
        finally:
            stop.set()
        outcomes = future.result(timeout=RUN_CAP + 300)
    return outcomes, injected, time.monotonic() - start


def check_outcomes(outcomes: list[Outcome], oracle: Reference) -> None:
    assert all(o.ok for o in outcomes), workload.failures(outcomes)
    mismatches = greedy_mismatches(outcomes, oracle)
    assert not mismatches, f"{len(mismatches)} greedy outputs differ from the target alone:\n" + "\n".join(
        mismatches[:5]
    )


# --- the draft killed and restarted -------------------------------------------------------------------------


def kill_and_restart_draft(
    star: ProxiedStar, oracle: Reference, name: str, kills: int, seed: int, clients: int, think: float
) -> None:
    prime_oracle(oracle)
    s = star.star
    linked_again = [0.0]

    def inject(rng: random.Random) -> dict[str, Any]:
        events = []
        for _ in range(kills):
            time.sleep(rng.uniform(0.5, 4.0))  # a random moment of the load
            killed = time.monotonic()
            s.kill_draft()  # SIGKILL: no goodbye to the targets, sessions and caches gone
            time.sleep(rng.uniform(0.0, 2.0))  # down a random while (plus its start-up)
            s.restart_draft(timeout=START_TIMEOUT)
            up = time.monotonic()
            relinked = wait_linked(star.urls)
            events.append(
                {"down_s": round(up - killed, 2), "relinked_after_s": round(relinked, 2), "at": round(killed, 2)}
            )
        linked_again[0] = time.monotonic()
        time.sleep(4.0)  # and the load goes on against the restored star
        return {"draft_kills": kills, "kill_events": events}

    # Targets decoding alone take the CPU a restarting draft needs to load its model on this shared machine:
    # clients pause between requests, so the draft comes back in seconds rather than minutes.
    outcomes, injected, wall = run_with_faults(star, seed, inject, clients=clients, think=think)
    figures = workload.summarize(outcomes, wall, fault_seed=seed, clients=clients, **injected)
    workload.report(name, figures)
    check_outcomes(outcomes, oracle)
    assert figures["fallback_tokens"] > 0, "the kills landed while no request was running"
    after = [o for o in outcomes if o.started > linked_again[0]]
    assert after and sum(o.stats["drafted_tokens"] for o in after) > 0, "no drafting after the last restart"
    wait_sessions_freed(s)


@pytest.mark.timeout(1200)
def test_the_draft_killed_at_random_moments_loses_no_request(healthy_star: ProxiedStar, oracle: Reference) -> None:
    kill_and_restart_draft(healthy_star, oracle, "draft-kills", kills=3, seed=8, clients=4, think=0.3)


@pytest.mark.slow
@soak_only
@pytest.mark.timeout(3600)
def test_soak_the_draft_killed_many_times(healthy_star: ProxiedStar, oracle: Reference) -> None:
    kill_and_restart_draft(healthy_star, oracle, "draft-kills-soak", kills=12, seed=88, clients=12, think=0.1)


# --- the draft link cut ---------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_cut_draft_connections_are_reopened_and_lose_no_request(healthy_star: ProxiedStar, oracle: Reference) -> None:
    prime_oracle(oracle)
    star = healthy_star
    reconnected = [0.0]

    def inject(rng: random.Random) -> dict[str, Any]:
        cut = 0
        for _ in range(4):
            time.sleep(rng.uniform(0.5, 2.5))
            cut += star.proxy.cut()  # every target's stream reset at once; the draft lives on
        wait_linked(star.urls)
        reconnected[0] = time.monotonic()
        time.sleep(3.0)
        return {"link_cuts": 4, "connections_cut": cut}

    outcomes, injected, wall = run_with_faults(star, seed=9, inject=inject)
    figures = workload.summarize(outcomes, wall, fault_seed=9, **injected)
    workload.report("link-cuts", figures)
    check_outcomes(outcomes, oracle)
    assert injected["connections_cut"] >= 4  # each cut found the targets' streams open
    after = [o for o in outcomes if o.started > reconnected[0]]
    assert after and sum(o.stats["drafted_tokens"] for o in after) > 0
    wait_sessions_freed(star.star)  # the cut streams' sessions were freed on the draft


# --- a target killed ------------------------------------------------------------------------------------


@pytest.fixture
def victim(healthy_star: ProxiedStar) -> Iterator[tuple[Target, ThreadedFaultProxy]]:
    """A fourth target, its draft link slowed so that its completions stay in flight for seconds."""
    star = healthy_star
    proxy = ThreadedFaultProxy("127.0.0.1", star.star.draft_port).start()
    target = None
    try:
        target = start_target(star.pair[1], proxy.address, "victim", star.log_dir, ["--draft-timeout", "5"])
        proxy.set_delay(0.15)  # each round waits >= 0.3 s for its proposal: a 160-token completion takes seconds
        yield target, proxy
    finally:
        if target is not None:
            target.kill()
        proxy.stop()


@pytest.mark.timeout(900)
def test_a_killed_target_frees_its_draft_sessions_and_the_others_do_not_notice(
    healthy_star: ProxiedStar, victim: tuple[Target, ThreadedFaultProxy], oracle: Reference
) -> None:
    prime_oracle(oracle)
    star, (target, _) = healthy_star, victim
    wait_sessions_freed(star.star)
    held = [HeldStream(target.url, p, 160) for p in long_greedy_prompts(oracle, 4, 160)]
    assert all(h.status == 200 and h.first for h in held)
    sessions_before_kill = draft_sessions(star.star)  # only the victim is busy now
    assert sessions_before_kill >= 1, "the victim's completions hold no session on the draft"
    targets_before = draft_load(star.star)["targets"]  # the star's three, the victim, and whatever else is up
    assert targets_before >= len(star.urls) + 1

    def inject(rng: random.Random) -> dict[str, Any]:
        time.sleep(rng.uniform(0.5, 2.0))
        target.kill()  # SIGKILL, mid-completion
        time.sleep(3.0)
        return {"targets_killed": 1, "victim_sessions_at_kill": sessions_before_kill}

    outcomes, injected, wall = run_with_faults(star, seed=10, inject=inject)
    victims_cut = sum(1 for h in held if not h.finish()[0])
    freed_within = wait_sessions_freed(star.star)
    load = draft_load(star.star)
    figures = workload.summarize(
        outcomes,
        wall,
        fault_seed=10,
        victim_requests_cut=victims_cut,
        victim_sessions_freed_within_s=round(freed_within, 2),
        **injected,
    )
    workload.report("target-kill", figures)
    assert victims_cut == len(held)  # they were in flight: the kill cut them (the intended failures)
    check_outcomes(outcomes, oracle)  # the other targets: nothing failed, nothing changed
    assert figures["drafted_tokens"] > 0
    assert load["targets"] == targets_before - 1  # the victim's stream is gone
    assert draft_metrics(star.star)["starsd_draft_connected_targets"] == targets_before - 1
    assert draft_sessions(star.star) == 0  # the victim never released its sessions: the disconnect freed them


# --- a slow link ----------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_a_slow_link_pushes_targets_into_fallback_and_back(healthy_star: ProxiedStar, oracle: Reference) -> None:
    prime_oracle(oracle)
    star = healthy_star
    delay = 1.2 * DRAFT_TIMEOUT  # one way: a round trip takes 2.4x the targets' deadline
    star.proxy.set_delay(delay)
    slow = workload.run(
        Workload(star.urls, PROMPTS, clients=6, duration=6.0, max_tokens=MAX_TOKENS, sampled_fraction=0, seed=11)
    )
    star.proxy.set_delay(0.0)
    time.sleep(2 * delay)  # bytes read under the delay still arrive late
    healed = workload.run(
        Workload(star.urls, PROMPTS, clients=6, duration=6.0, max_tokens=MAX_TOKENS, sampled_fraction=0, seed=12)
    )
    slow_figures = workload.summarize(slow, 6.0, added_delay_s=delay, draft_timeout_s=DRAFT_TIMEOUT)
    healed_figures = workload.summarize(healed, 6.0, added_delay_s=0.0, draft_timeout_s=DRAFT_TIMEOUT)
    workload.report("slow-link", {"slow": slow_figures, "healed": healed_figures})
    check_outcomes(slow, oracle)
    check_outcomes(healed, oracle)
    assert slow_figures["fallback_tokens"] > 0, "the delay did not push any target into fallback"
    assert healed_figures["drafted_tokens"] > 0, "drafting did not come back once the delay was gone"
    assert any(o.stats["fallback_tokens"] == 0 and o.stats["drafted_tokens"] > 0 for o in healed)
    wait_sessions_freed(star.star)
