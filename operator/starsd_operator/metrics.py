"""The operator's own Prometheus metrics (``starsd_operator_*``), served on ``/metrics`` of
:data:`~.constants.METRICS_PORT` (the chart's ServiceMonitor scrapes it).

They count what an operator's health is read from: passes per handler, repairs per kind, errors, the tick's
duration, the rebalancer's decisions, status writes, and every request the operator itself sends to the API
server (kopf's watches and status patches aside), by verb and kind.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "starsd_operator_reconciles", "Passes over a cluster, by handler (reconcile, tick)", ["handler"], registry=REGISTRY
)
REPAIRS = Counter(
    "starsd_operator_repairs",
    "Children applied again because they were missing or drifted",
    ["kind"],
    registry=REGISTRY,
)
ERRORS = Counter("starsd_operator_errors", "Passes that failed, by where", ["where"], registry=REGISTRY)
TICK_SECONDS = Histogram(
    "starsd_operator_tick_duration_seconds",
    "One tick of one cluster: repair, status, load reading and rebalancing",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
DECISIONS = Counter(
    "starsd_operator_rebalancer_decisions", "The rebalancer's decisions, by reason", ["reason"], registry=REGISTRY
)
STATUS_WRITES = Counter("starsd_operator_status_writes", "Status patches the tick wrote", registry=REGISTRY)
API_REQUESTS = Counter(
    "starsd_operator_api_requests",
    "Requests the operator's own client sent to the API server, by verb and kind",
    ["verb", "kind"],
    registry=REGISTRY,
)


def serve(port: int) -> None:
    """Serve :data:`REGISTRY` on ``0.0.0.0:port/metrics`` from a daemon thread."""
    start_http_server(port, registry=REGISTRY)
