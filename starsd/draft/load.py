"""The draft's measured load over a sliding window: what `/v1/load` reports and the operator acts on."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from starsd import system_model


@dataclass(frozen=True)
class LoadSnapshot:
    utilization: float  # busy fraction of the draft over the window
    window_seconds: float
    tq_seconds: float  # mean draft service time per request
    tp_seconds: float  # mean verify time reported by targets
    tc_seconds: float  # mean one-way transfer time, derived from targets' round trips
    queue_depth: int
    targets: int  # connected target streams
    regime: str  # UnderLoaded | FullyLoaded
    active_sessions: int  # sessions that sent a request within the window (the demand signal)
    recommended_targets: int  # N* from the system model (0 while there is no measurement)
    requests: int  # requests served within the window
    busy_seconds_total: float
    # The targets' demand, from what each reported on its latest request within the window (a target that
    # sent nothing in the window had nothing running that needed the draft): completions running and waiting
    # at the targets, and the mean of running / max-num-seqs over the connected targets.
    running_requests: int = 0
    waiting_requests: int = 0
    target_occupancy: float = 0.0

    def to_json(self) -> dict[str, float | int | str]:
        return asdict(self)


def _mean(samples: deque[tuple[float, float]]) -> float:
    return sum(v for _, v in samples) / len(samples) if samples else 0.0


class LoadTracker:
    """Thread-safe: the compute thread records service, the event loop records requests and reads."""

    def __init__(self, window_seconds: float = 10.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.window = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._busy: deque[tuple[float, float]] = deque()  # (start, end) of service periods
        self._service: deque[tuple[float, float]] = deque()  # (end, per-request service seconds)
        self._verify: deque[tuple[float, float]] = deque()  # (time, tp)
        self._transfer: deque[tuple[float, float]] = deque()  # (time, tc)
        self._last_request: dict[object, float] = {}  # session key -> time of its last request
        self._demand: dict[str, tuple[float, int, int, float]] = {}  # target id -> (time, running, waiting, occ.)
        self._keys_pruned = self._started
        self.busy_seconds_total = 0.0

    def _prune(self, now: float) -> None:
        """Drop what has left the window (called under the lock on every record, so memory stays bounded)."""
        since = now - self.window
        for dq in (self._service, self._verify, self._transfer):
            while dq and dq[0][0] < since:
                dq.popleft()
        while self._busy and self._busy[0][1] < since:
            self._busy.popleft()
        if now - self._keys_pruned > self.window / 4:  # the session map is scanned now and then, not per call
            for key in [k for k, t in self._last_request.items() if t < since]:
                del self._last_request[key]
            self._keys_pruned = now

    def record_service(self, start: float, end: float, requests: int) -> None:
        with self._lock:
            self._busy.append((start, end))
            per_request = (end - start) / max(1, requests)
            for _ in range(requests):
                self._service.append((end, per_request))
            self.busy_seconds_total += end - start
            self._prune(end)

    def record_request(self, session_key: object, verify_seconds: float, transfer_seconds: float | None) -> None:
        now = self._clock()
        with self._lock:
            self._last_request[session_key] = now
            if verify_seconds > 0:
                self._verify.append((now, verify_seconds))
            if transfer_seconds is not None and transfer_seconds >= 0:
                self._transfer.append((now, transfer_seconds))
            self._prune(now)

    def record_demand(self, target_id: str, running: int, waiting: int, occupancy: float) -> None:
        now = self._clock()
        with self._lock:
            self._demand[target_id] = (now, running, waiting, min(1.0, occupancy))

    def forget_target(self, target_id: str) -> None:
        with self._lock:
            self._demand.pop(target_id, None)

    def forget(self, session_key: object) -> None:
        with self._lock:
            self._last_request.pop(session_key, None)

    def snapshot(self, targets: int, queue_depth: int) -> LoadSnapshot:
        now = self._clock()
        since = now - self.window
        with self._lock:
            self._keys_pruned = -float("inf")  # a full prune: active_sessions counts only the window
            self._prune(now)
            busy = sum(min(end, now) - max(start, since) for start, end in self._busy)
            span = min(self.window, now - self._started)
            active = len(self._last_request)
            tq, tp, tc = _mean(self._service), _mean(self._verify), _mean(self._transfer)
            served = len(self._service)
            total = self.busy_seconds_total
            for key in [k for k, (t, *_) in self._demand.items() if t < since]:
                del self._demand[key]
            reports = list(self._demand.values())
        utilization = min(1.0, busy / span) if span > 0 else 0.0
        if tq > 0 and targets > 0:
            regime = str(system_model.regime(targets, tq, tp, tc))
            recommended = system_model.optimal_targets(tq, tp, tc) if tp > 0 else 0
        else:
            regime, recommended = str(system_model.Regime.UNDER_LOADED), 0
        return LoadSnapshot(
            utilization=round(utilization, 4),
            window_seconds=self.window,
            tq_seconds=tq,
            tp_seconds=tp,
            tc_seconds=tc,
            queue_depth=queue_depth,
            targets=targets,
            regime=regime,
            active_sessions=active,
            recommended_targets=recommended,
            requests=served,
            busy_seconds_total=round(total, 6),
            running_requests=sum(r[1] for r in reports),
            waiting_requests=sum(r[2] for r in reports),
            target_occupancy=round(min(1.0, sum(r[3] for r in reports) / targets), 4) if targets else 0.0,
        )
