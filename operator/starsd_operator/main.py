"""Starting the operator: kopf's settings, the handler registry and the run loop.

The operator runs standalone, or with ``--peering NAME`` as one of several replicas of which kopf keeps one
active (the highest random priority) and the others on standby (what the chart deploys); it keeps kopf's own
bookkeeping in ``starsd.io/*`` annotations so the status holds only what the CRD declares, and posts only
the Events it chooses (each rebalancing decision) plus kopf's warnings and errors.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from starsd import defaults

from . import constants as c
from . import handlers, kube, metrics, uninstall
from .clusters import Clusters
from .controller import Config
from .podspec import Images

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    namespace: str | None = None  # None: every namespace
    liveness_port: int = defaults.OPERATOR_HEALTH_PORT
    metrics_port: int = defaults.OPERATOR_METRICS_PORT  # the operator's /metrics; 0: not served
    tick_interval: float = 5.0  # seconds between status refreshes and load readings of one cluster
    load_timeout: float = 3.0
    allow_load_url_annotation: bool = False  # honour starsd.io/load-url (tests; never in a shared cluster)
    peering: str | None = None  # kopf peering object: one active operator, the others on standby
    priority: int | None = None  # this operator's peering priority (None: random, so one is active)


class QuietTicks(logging.Filter):
    """Drops kopf's success lines of the handlers that run all the time: the tick (one per cluster every few
    seconds), the indexers and the watch handlers (one per event of every child and pod). They say nothing
    that the status and the Events do not; failures and everything else still get through."""

    QUIET = re.compile(r"^(Timer 'tick'|Indexer '[^']+'|Handler '(seen|changed_[^']+)') succeeded\.$")

    def filter(self, record: logging.LogRecord) -> bool:
        return self.QUIET.match(record.getMessage()) is None


class ObjectNames(logging.Filter):
    """Puts the cluster a kopf per-object line is about in front of it (``[ml/chat] Created: ...``), so the
    log of an operator that watches many clusters says which one each line concerns. Set on the process's
    output handlers, after kopf's own handler has posted the line as an Event (where the object is implied)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and not getattr(record, "starsd_named", False):
            record.msg = f"[{ref.get('namespace') or '-'}/{ref.get('name')}] {record.msg}"
            record.starsd_named = True
        return True


PEERING_LIFETIME = 10  # seconds: a standby takes over this long after the active operator stops answering


def configure_settings(
    settings: kopf.OperatorSettings, *, namespaced: bool = False, peering: str | None = None
) -> None:
    settings.peering.standalone = peering is None
    if peering is not None:
        settings.peering.name = peering
        settings.peering.mandatory = True  # no peering object: refuse to run rather than run unguarded
        settings.peering.clusterwide = not namespaced
        settings.peering.lifetime = PEERING_LIFETIME
    # Watching one namespace, kopf needs no cluster-wide scans of CRDs and namespaces: the operator then
    # runs under a namespaced Role (permissions.py).
    settings.scanning.disabled = namespaced
    settings.persistence.finalizer = c.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.KOPF_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Watches that go quiet are re-established rather than trusted forever.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60


def build_registry(options: Options) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, tick_interval=options.tick_interval)

    async def startup(logger: Any, **_: Any) -> None:
        if options.metrics_port:
            metrics.serve(options.metrics_port)
        await asyncio.to_thread(warn_stuck, options.namespace)

    kopf.on.startup(registry=registry, id="startup")(startup)
    return registry


def build_settings(*, namespaced: bool = False, peering: str | None = None) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    configure_settings(settings, namespaced=namespaced, peering=peering)
    return settings


def run(options: Options, env: Mapping[str, str] | None = None) -> None:
    """Run until interrupted (SIGINT/SIGTERM)."""
    env = os.environ if env is None else env
    kube.load_config()
    logging.getLogger("kopf.objects").addFilter(QuietTicks())
    for handler in logging.getLogger().handlers:
        handler.addFilter(ObjectNames())
    config = Config(
        images=Images.from_env(env),
        load_timeout=options.load_timeout,
        allow_load_url_annotation=options.allow_load_url_annotation,
    )
    log.info(
        "starsd operator: %s, draft image %s, target image %s",
        f"namespace {options.namespace}" if options.namespace else "all namespaces",
        config.images.draft,
        config.images.target,
    )
    if config.allow_load_url_annotation:
        log.warning(
            "the %s annotation is honoured: whoever may edit a StarSDCluster chooses a URL it reads",
            c.ANNOTATION_LOAD_URL,
        )
    kopf.run(
        registry=build_registry(options),
        settings=build_settings(namespaced=options.namespace is not None, peering=options.peering),
        standalone=options.peering is None,
        peering_name=options.peering,
        priority=options.priority if options.priority is not None else random.randint(1, 2**31 - 1),
        clusterwide=options.namespace is None,
        namespaces=[options.namespace] if options.namespace else (),
        liveness_endpoint=f"http://0.0.0.0:{options.liveness_port}/healthz",
        memo=kopf.Memo(kube=kube.ApiServer(), config=config, **{handlers.CLUSTERS_KEY: Clusters()}),
    )


def warn_stuck(namespace: str | None) -> None:
    """Log a warning for each cluster found waiting for deletion (see :mod:`.uninstall`)."""
    try:
        bodies = kube.list_clusters(namespace)
    except kube.KubeError as exc:
        log.warning("cannot list the StarSDClusters to look for ones stuck in deletion: %s", exc)
        return
    for message in uninstall.stuck(bodies):
        log.warning(message)
