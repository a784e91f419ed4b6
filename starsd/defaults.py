"""Defaults and limits of StarSD: every number that the CLI, the servers, the operator, the CRD and the chart share.

One fact, one place: the commands' flags, the servers' option dataclasses and the operator's spec parser
import these; ``crds/starsdcluster.yaml`` (and the chart's copy of it), ``charts/starsd/values.yaml`` and
``values.schema.json`` cannot import Python, so ``tests/test_defaults.py`` checks that they declare the same
values. Change a number here, run that test, and it names every file that still says the old one.

Names: ``X`` is the default, ``X_MIN`` / ``X_MAX`` the accepted range (inclusive). A tuple of choices lists
the default first. This module imports nothing, so that the operator's lean image can read it too.
"""

from __future__ import annotations

from typing import Final

# --- Speculation -------------------------------------------------------------------------------------------
GAMMA: Final = 4  # draft tokens proposed per round (`starsd target --gamma`, spec.target.gamma)
GAMMA_MIN: Final = 1
GAMMA_MAX: Final = 16  # the most a target may ask for, and what a draft accepts by default (--max-gamma)
PROPOSAL_TOP_K: Final = 8  # support of a sampled proposal's reported distribution (`starsd target --top-k`)

# --- Ports (the images' EXPOSE lines and the operator's Services use the same) -------------------------------
DRAFT_GRPC_PORT: Final = 50051
DRAFT_METRICS_PORT: Final = 9090  # /v1/load, /metrics, /healthz, /readyz of a draft
TARGET_HTTP_PORT: Final = 8000  # the OpenAI API, /metrics, /healthz, /readyz of a target
OPERATOR_HEALTH_PORT: Final = 8080  # kopf's liveness endpoint (/healthz)
OPERATOR_METRICS_PORT: Final = 8081  # the operator's own Prometheus metrics (/metrics)

# --- Access ------------------------------------------------------------------------------------------------
# The environment variable holding a target's accepted API keys (starsd.openai_api.auth); the operator fills it
# from spec.auth.apiKeySecretRef.
API_KEY_ENV: Final = "STARSD_API_KEY"
VLLM_API_KEY_ENV: Final = "VLLM_API_KEY"  # the same Secret's key for a vLLM pool (vLLM takes it as one key)

# --- vLLM as a target (starsd.integrations.vllm, docs/vllm.md) ---------------------------------------------
# The proposer class vLLM loads (`--speculative-config {"method": "custom_class", "model": ...}`).
VLLM_PROPOSER_CLASS: Final = "starsd.integrations.vllm.StarSDProposer"

# --- Placement ---------------------------------------------------------------------------------------------
# The node a pod runs on (the operator sets it from the downward API's spec.nodeName); a process that cannot use
# the GPU it was told to use names the node in its message (starsd.devices.cuda_refusal).
NODE_NAME_ENV: Final = "STARSD_NODE_NAME"
DTYPES: Final = ("auto", "float32", "bfloat16", "float16")  # auto: bfloat16 on CUDA, float32 on the CPU

# --- Pod resources (the operator's pods) --------------------------------------------------------------------
# CPU and memory requested by a role's container when its spec's resources name neither (requests nor limits):
# the pods are Burstable, never BestEffort (the first evicted under memory pressure). Sized for small models;
# a large checkpoint wants spec.*.resources.requests of its own (host memory of about its size while it loads).
DRAFT_CPU_REQUEST: Final = "1"
DRAFT_MEMORY_REQUEST: Final = "4Gi"
TARGET_CPU_REQUEST: Final = "2"
TARGET_MEMORY_REQUEST: Final = "8Gi"
# sizeLimit of the pods' emptyDir volumes (spec.draft.sizeLimits, spec.target.sizeLimits): /tmp (caches under
# HOME), /dev/shm (memory-backed, GPU pods only) and a model downloaded without a cache claim.
TMP_SIZE_LIMIT: Final = "1Gi"
SHM_SIZE_LIMIT: Final = "1Gi"
MODEL_SIZE_LIMIT: Final = "100Gi"

# --- The draft ---------------------------------------------------------------------------------------------
DRAFT_MAX_BATCH: Final = 32  # a real model's requests per step: 32 cost 2.5x one on a CPU (measured)
DRAFT_MAX_BATCH_MIN: Final = 1
DRAFT_MAX_BATCH_MAX: Final = 256
DRAFT_SCHEDULES: Final = ("fifo", "fair")
DRAFT_MAX_SESSIONS: Final = 1024  # sessions one draft holds at once
DRAFT_IDLE_TIMEOUT_SECONDS: Final = 300.0  # an idle session's state is freed after this

# --- The target: batching and its key/value cache ----------------------------------------------------------
MAX_NUM_SEQS: Final = 64  # completions running at once per target, the rows of one step
MAX_NUM_SEQS_MIN: Final = 1
MAX_NUM_SEQS_MAX: Final = 4096
MAX_PREFILL_TOKENS: Final = 512  # prompt tokens fed per completion and step (longer prompts go in chunks)
GPU_MEMORY_FRACTION: Final = 0.9  # CUDA: the share of the GPU the weights and the key/value cache may use
TARGET_MAX_CONCURRENCY: Final = 256  # completions admitted at once (running or waiting); more get 429
MAX_TOKENS_CAP: Final = 4096  # the largest max_tokens a request may ask for
MAX_BODY_BYTES: Final = 1 << 20  # the largest HTTP request body
DRAFT_TIMEOUT_SECONDS: Final = 2.0  # a round waits this long for the draft before decoding alone

# --- The StarSDCluster resource (the CRD's defaults; the operator parses a spec with the same) ---------------
IMAGE_POLICIES: Final = ("Pinned", "FollowOperator")
TARGET_REPLICAS: Final = 1  # spec.targets.replicas
DRAFT_REPLICAS: Final = 1  # spec.draft.replicas: draft pods, each serving its share of the targets
DRAFT_REPLICAS_MIN: Final = 1
DRAFT_REPLICAS_MAX: Final = 32  # the drafts' balance is measured up to here (tests/test_rendezvous.py)
POOL_WEIGHT: Final = 1
POOL_WEIGHT_MAX: Final = 1000
POOL_MIN_REPLICAS: Final = 0
POOL_MAX_REPLICAS: Final = 64
POOL_REPLICAS_MAX: Final = 1000  # the largest maxReplicas a pool may declare
MAX_UNAVAILABLE: Final = 1  # each PodDisruptionBudget's maxUnavailable
# A pool's engine (spec.pools[].engine): starsd runs `starsd target`, vllm runs `vllm serve` with StarSD's proposer.
ENGINES: Final = ("starsd", "vllm")
VLLM_ARGS_MAX: Final = 64  # extra `vllm serve` arguments a pool may give (spec.pools[].vllm.args)

# Pod lifecycle (spec.draft / spec.target: terminationGracePeriodSeconds and probes)
GRACE_SECONDS: Final = 120
GRACE_SECONDS_MAX: Final = 86400
STARTUP_SECONDS: Final = 600  # how long a model may take to load before liveness counts
STARTUP_SECONDS_MIN: Final = 10
STARTUP_SECONDS_MAX: Final = 86400
READINESS_PERIOD_SECONDS: Final = 5
LIVENESS_PERIOD_SECONDS: Final = 10
PROBE_PERIOD_SECONDS_MAX: Final = 300
PROBE_TIMEOUT_SECONDS: Final = 2
PROBE_TIMEOUT_SECONDS_MAX: Final = 60

# Rolling a change through the pools (spec.target.rollout)
MIN_READY_SECONDS: Final = 0  # a replaced pod counts as available after this long ready
MIN_READY_SECONDS_MAX: Final = 3600
PROGRESS_DEADLINE_SECONDS: Final = 600  # a pool's rollout halts when an updated pod is not ready by then
PROGRESS_DEADLINE_SECONDS_MAX: Final = 7 * 86400

# The rebalancer (spec.autoscaling)
MIN_TARGETS: Final = 1
MAX_TARGETS: Final = 16
MIN_DRAFTS: Final = 1  # spec.autoscaling.minDrafts / maxDrafts: 1 and 1 keep one draft unless the user opts in
MAX_DRAFTS: Final = 1
UNDERLOADED_UTILIZATION: Final = 0.7
SATURATED_UTILIZATION: Final = 0.9
SCALE_IN_OCCUPANCY: Final = 0.1
SATURATED_OCCUPANCY: Final = 0.8
TOLERANCE: Final = 0.1
SCALE_UP_WINDOW_SECONDS: Final = 30
SCALE_UP_MAX_STEP: Final = 4
SCALE_DOWN_WINDOW_SECONDS: Final = 300
SCALE_DOWN_MAX_STEP: Final = 2
STABILIZATION_WINDOW_SECONDS_MAX: Final = 3600
RATE_POLICY_TYPES: Final = ("Pods", "Percent")
RATE_POLICY_PERIOD_SECONDS_MAX: Final = 1800
SELECT_POLICIES: Final = ("Max", "Min", "Disabled")
CONVERGENCE_TIMEOUT_SECONDS: Final = 600
CONVERGENCE_TIMEOUT_SECONDS_MAX: Final = 86400
