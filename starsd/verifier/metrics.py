"""The target's Prometheus metrics: vLLM's names (``vllm:*``, labelled ``model_name``) for what vLLM also
measures, so vLLM users' dashboards keep working, and ``starsd_*`` for the star's own (draft round trips,
fallback tokens, rounds, steps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from starsd.verifier.draft_pool import Reason

# Why a request was refused 401 (the label of starsd_target_unauthorized_requests; starsd.openai_api.auth):
# no Authorization header or not a Bearer one, or a Bearer key that is not one of the accepted keys.
UNAUTHORIZED_REASONS = ("missing", "invalid")

# vLLM's buckets for its request latency histograms (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)


class VllmMetrics:
    """The ``vllm:*`` series, each labelled ``model_name`` (the served model name)."""

    def __init__(self, r: CollectorRegistry) -> None:
        m = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests generating", m, registry=r)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting for a slot or key/value budget", m, registry=r
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", m, registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to the first token", m, buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between output tokens (a round's gap shared by the tokens it committed)",
            m,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency, arrival to last token",
            m,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.success = Counter(
            "vllm:request_success", "Finished requests (per choice)", [*m, "finished_reason"], registry=r
        )
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Rounds verified with a draft proposal", m, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified", m, registry=r)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted", m, registry=r)
        self.accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0: the first)",
            [*m, "position"],
            registry=r,
        )


class TargetMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, model_name: str = "") -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name  # the served model's name (set by the HTTP server)
        r = self.registry
        self.vllm = VllmMetrics(r)
        self.requests = Counter("starsd_target_requests", "Completions by outcome", ["status"], registry=r)
        self.unauthorized = Counter(
            "starsd_target_unauthorized_requests",
            "Requests refused 401 for want of an accepted API key (reason: missing, invalid)",
            ["reason"],
            registry=r,
        )
        for reason in UNAUTHORIZED_REASONS:  # both series exist from the start, at 0
            self.unauthorized.labels(reason=reason)
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
        self.draft_switches = Counter(
            "starsd_target_draft_switches",
            "Moves from one draft to another (reason: draft_lost, first_choice_back, drafts_changed)",
            ["reason"],
            registry=r,
        )
        for reason in Reason:  # every series exists from the start, at 0
            self.draft_switches.labels(reason=str(reason))
        self.drafts_found = Gauge(
            "starsd_target_drafts_found",
            "Drafts this target knows (found live with --drafts-from, or its --draft list)",
            registry=r,
        )
        self.drafts_lookup_failing = Gauge(
            "starsd_target_drafts_lookup_failing",
            "1 while the last lookup of --drafts-from failed (the drafts last found are kept)",
            registry=r,
        )
        self.draft_rank = Gauge(
            "starsd_target_draft_rank",
            "Position of the draft in use in this target's order (0: its first choice; -1: none)",
            registry=r,
        )
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

    def draft_switched(self, reason: Reason) -> None:
        """This target moved to another draft (see starsd.verifier.draft_pool)."""
        self.draft_switches.labels(reason=str(reason)).inc()

    def prompt_tokens(self, tokens: int) -> None:
        self.vllm.prompt_tokens.labels(self.model_name).inc(tokens)

    def scheduler_state(self, running: int, waiting: int) -> None:
        self.vllm.running.labels(self.model_name).set(running)
        self.vllm.waiting.labels(self.model_name).set(waiting)

    def inter_token(self, gap: float, tokens: int) -> None:
        """A round committed ``tokens`` tokens ``gap`` seconds after the previous one."""
        for _ in range(tokens):
            self.vllm.itl.labels(self.model_name).observe(gap / tokens)

    def finished(self, reason: str, generated: int, arrived: float, first_token_at: float | None, now: float) -> None:
        """One choice ended (``reason``: stop or length) after generating ``generated`` tokens."""
        name = self.model_name
        self.vllm.success.labels(name, reason).inc()
        self.vllm.generation_tokens.labels(name).inc(generated)
        self.vllm.e2e.labels(name).observe(now - arrived)
        if first_token_at is not None:
            self.vllm.ttft.labels(name).observe(first_token_at - arrived)

    def round(self, drafted: int, accepted: int) -> None:
        """A verified round: ``drafted`` draft tokens counted, the first ``accepted`` of them accepted."""
        name = self.model_name
        if drafted:
            self.vllm.drafts.labels(name).inc()
            self.vllm.draft_tokens.labels(name).inc(drafted)
            self.vllm.accepted_tokens.labels(name).inc(accepted)
        for position in range(accepted):
            self.vllm.accepted_per_pos.labels(name, str(position)).inc()
