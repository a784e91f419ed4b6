"""The target's Prometheus metrics (prefix ``starsd_``; the spec-decode counters mirror vLLM's names)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class TargetMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("starsd_target_requests", "Completions by outcome", ["status"], registry=r)
        self.draft_tokens = Counter(
            "starsd_spec_decode_num_draft_tokens", "Draft tokens verified by this target", registry=r
        )
        self.accepted_tokens = Counter(
            "starsd_spec_decode_num_accepted_tokens", "Draft tokens accepted by this target", registry=r
        )
        self.generated_tokens = Counter("starsd_target_generated_tokens", "Tokens generated", registry=r)
        self.fallback_tokens = Counter(
            "starsd_target_fallback_tokens", "Tokens generated without a draft proposal", registry=r
        )
        self.malformed_proposals = Counter(
            "starsd_target_malformed_proposals",
            "Draft answers that failed validation (the round decoded alone)",
            registry=r,
        )
        self.running = Gauge("starsd_target_running_sessions", "Completions admitted and generating", registry=r)
        self.waiting = Gauge(
            "starsd_target_waiting_requests", "Completions waiting for a batch slot or key/value budget", registry=r
        )
        self.step_rows = Histogram(
            "starsd_target_step_rows",
            "Sessions in one model step (continuous batching)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.rounds = Counter("starsd_target_rounds", "Verification rounds", registry=r)
        self.active = Gauge("starsd_target_active_requests", "Completions in progress", registry=r)
        self.draft_connected = Gauge("starsd_target_draft_connected", "1 while the draft stream is up", registry=r)
        self.verify_seconds = Histogram(
            "starsd_target_verify_seconds",
            "Target model step time (one forward pass over every ready session, and verification)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=r,
        )
        self.draft_rtt_seconds = Histogram(
            "starsd_target_draft_rtt_seconds",
            "Round trip to the draft per round (queueing and drafting included)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r,
        )
