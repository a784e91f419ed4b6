"""Names that the CRD, the chart, the images and the e2e tests agree on (docs/architecture.md); numbers that
the data plane shares with them come from :mod:`starsd.defaults`."""

from __future__ import annotations

from typing import Final

from starsd import defaults

GROUP: Final = "starsd.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "StarSDCluster"
PLURAL: Final = "starsdclusters"

# Who we are to the API server: server-side apply field manager, finalizer, kopf's bookkeeping prefix.
FIELD_MANAGER: Final = "starsd-operator"
FINALIZER: Final = f"{GROUP}/finalizer"
KOPF_PREFIX: Final = GROUP

# Recommended labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_POOL: Final = f"{GROUP}/pool"
# On the one Service per workload that lists each of its pods once (the draft's and every pool's headless
# Service): what the chart's ServiceMonitors select, so each pod is scraped once.
LABEL_SCRAPE: Final = f"{GROUP}/scrape"
APP_NAME: Final = "starsd"
MANAGED_BY: Final = "starsd-operator"
COMPONENT_DRAFT: Final = "draft"
COMPONENT_TARGET: Final = "target"

# Set on a StarSDCluster to read the draft's load from elsewhere than its Service (an operator running
# outside the cluster, or a test driving a real draft on loopback); honoured only when the operator runs
# with --allow-load-url-annotation.
ANNOTATION_LOAD_URL: Final = f"{GROUP}/load-url"

# Ports the data plane listens on (the servers' own defaults).
DRAFT_GRPC_PORT: Final = defaults.DRAFT_GRPC_PORT
DRAFT_METRICS_PORT: Final = defaults.DRAFT_METRICS_PORT
TARGET_HTTP_PORT: Final = defaults.TARGET_HTTP_PORT
LOAD_PATH: Final = "/v1/load"

# Default images; the operator's environment overrides them, a resource's spec overrides those.
ENV_DRAFT_IMAGE: Final = "STARSD_DRAFT_IMAGE"
ENV_TARGET_IMAGE: Final = "STARSD_TARGET_IMAGE"
DEFAULT_DRAFT_IMAGE: Final = "starsd/draft:0.1.0"
DEFAULT_TARGET_IMAGE: Final = "starsd/target:0.1.0"

# The unprivileged user the pods run as; the images create it with this uid/gid.
RUN_AS_USER: Final = 10001

# Condition types written to status.conditions.
COND_READY: Final = "Ready"
COND_DRAFT_READY: Final = "DraftReady"
COND_TARGETS_READY: Final = "TargetsReady"
COND_REBALANCING: Final = "Rebalancing"
COND_STAR_CONNECTED: Final = "StarConnected"
COND_ROLLOUT_PROGRESSING: Final = "RolloutProgressing"
COND_AUTH_READY: Final = "AuthReady"  # the API key's Secret (spec.auth) is there for the target pods

# The Event reason of every rebalancing decision that changes the target count.
EVENT_REBALANCED: Final = "Rebalanced"
# Normal Events of a reconcile, as a Deployment gives them: a child created, a workload's replicas changed,
# a pool's children deleted.
EVENT_CREATED: Final = "Created"
EVENT_SCALED: Final = "Scaled"
EVENT_DELETED: Final = "Deleted"
# A child that was missing, or whose operator-owned fields someone changed, applied again (controller.repair).
EVENT_REPAIRED: Final = "Repaired"
# Warning Events, each posted once while its cause lasts.
EVENT_LOAD_URL_IGNORED: Final = "LoadURLIgnored"
# A pool's rollout changing state (rollout.py): rolling, held behind an earlier pool, halted, done.
EVENT_POOL_ROLLING: Final = "PoolRolling"
EVENT_POOL_ROLLOUT_HELD: Final = "PoolRolloutHeld"
EVENT_POOL_ROLLOUT_HALTED: Final = "PoolRolloutHalted"
EVENT_POOL_ROLLED_OUT: Final = "PoolRolledOut"
