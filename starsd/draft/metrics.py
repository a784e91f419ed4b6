"""The draft's Prometheus metrics (prefix ``starsd_``), in a registry of its own per server."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DraftMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.busy_seconds = Counter("starsd_draft_busy_seconds", "Seconds the draft spent computing", registry=r)
        self.requests = Counter("starsd_draft_requests", "Proposal requests answered", registry=r)
        self.draft_tokens = Counter("starsd_spec_decode_num_draft_tokens", "Tokens proposed by the draft", registry=r)
        self.ahead_hits = Counter(
            "starsd_draft_ahead_hits",
            "Requests whose proposal had been drafted ahead, while the target verified",
            registry=r,
        )
        self.ahead_tokens = Counter(
            "starsd_draft_ahead_tokens",
            "Proposed tokens that had been drafted ahead, while the target verified",
            registry=r,
        )
        self.dropped = Counter(
            "starsd_draft_requests_dropped", "Queued requests dropped because their target disconnected", registry=r
        )
        self.errors = Counter("starsd_draft_errors", "Requests answered with an error", ["code"], registry=r)
        self.sessions = Gauge("starsd_draft_sessions", "Open draft sessions", registry=r)
        self.targets = Gauge("starsd_draft_connected_targets", "Connected target streams", registry=r)
        self.queue_depth = Gauge("starsd_draft_queue_depth", "Requests waiting for the draft", registry=r)
        self.service_seconds = Histogram(
            "starsd_draft_service_seconds",
            "Draft compute time per request",
            buckets=(0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0),
            registry=r,
        )
        # What the targets report with each request (the system model's Tp and Tc, as /v1/load averages them
        # over its window): here as totals, so that any span (a benchmark's pass, a dashboard's range) has its own.
        self.target_verify_seconds = Histogram(
            "starsd_draft_target_verify_seconds",
            "Targets' time between receiving a session's proposal and asking for its next one (Tp)",
            buckets=(0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0),
            registry=r,
        )
        self.transfer_seconds = Histogram(
            "starsd_draft_transfer_seconds",
            "One-way transfer time between a target and the draft, from the target's round trip (Tc)",
            buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064),
            registry=r,
        )
        self.batch_size = Histogram(
            "starsd_draft_batch_size",
            "Requests per drafting step",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
