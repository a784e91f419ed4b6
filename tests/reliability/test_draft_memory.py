"""The draft's bookkeeping must stay bounded however long it serves, whether or not anyone reads /v1/load."""

from __future__ import annotations

import tracemalloc

from starsd.draft.load import LoadTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_load_tracker_stays_bounded_when_nobody_reads_it() -> None:
    clock = Clock()
    tracker = LoadTracker(window_seconds=10.0, clock=clock)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(100_000):  # 2000 s of traffic at 50 requests/s: the window holds 500 of them
            clock.now += 0.02
            key = ("target-0", i)
            tracker.record_request(key, verify_seconds=0.003, transfer_seconds=0.001)
            tracker.record_service(clock.now, clock.now + 0.004, requests=1)
            if i % 2:
                tracker.forget(key)  # released; the other half are freed by a disconnect (no forget)
        retained = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    # What the window needs is a few hundred samples (well under 1 MB); 100 000 requests' worth is about 30 MB.
    assert retained < 4 * 1024 * 1024, f"{retained / 1e6:.1f} MB kept for a 10 s window"
