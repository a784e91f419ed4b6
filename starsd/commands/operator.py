"""``starsd operator``: run the Kubernetes operator (kopf) with the current kubeconfig or in-cluster config."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from starsd import defaults
from starsd.commands._common import tcp_port


def _port(text: str) -> int:
    value = tcp_port(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not a port probes can reach")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def liveness_port(url: str) -> int:
    """The port of a liveness URL such as ``http://0.0.0.0:8080/healthz`` (kopf's ``--liveness`` form)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.port is None:
        raise argparse.ArgumentTypeError(f"{url}: expected http://HOST:PORT/healthz")
    return parts.port


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.description = (
        "Run the StarSD operator: reconciles StarSDCluster resources into a draft Deployment and one target "
        "StatefulSet per node pool, keeps their status, and rebalances the target count from the draft's "
        "load. Uses the in-cluster service account when run in a pod, else the current kubeconfig context. "
        "Default images come from STARSD_DRAFT_IMAGE and STARSD_TARGET_IMAGE."
    )
    parser.add_argument("--namespace", default=None, help="watch this namespace only (default: every namespace)")
    parser.add_argument(
        "--liveness-port",
        type=_port,
        default=defaults.OPERATOR_HEALTH_PORT,
        help="serve GET http://0.0.0.0:PORT/healthz for probes",
    )
    parser.add_argument(
        "--liveness",
        type=liveness_port,
        default=None,
        dest="liveness_url_port",
        metavar="URL",
        help="the liveness endpoint as a URL (http://0.0.0.0:PORT/healthz); overrides --liveness-port",
    )
    parser.add_argument(
        "--metrics-port",
        type=tcp_port,
        default=defaults.OPERATOR_METRICS_PORT,
        help="serve the operator's Prometheus metrics on http://0.0.0.0:PORT/metrics (0: not at all)",
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=5.0,
        help="seconds between status refreshes and load readings of each StarSDCluster",
    )
    parser.add_argument("--load-timeout", type=_seconds, default=3.0, help="timeout in seconds of one /v1/load request")
    parser.add_argument(
        "--peering",
        default=None,
        metavar="NAME",
        help="run as one of several replicas: kopf's peering object NAME (a ClusterKopfPeering, or a KopfPeering "
        "in --namespace) keeps one active and the others on standby; without it the operator runs alone",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="this replica's peering priority, the highest is active (default: random)",
    )
    parser.add_argument(
        "--allow-load-url-annotation",
        action="store_true",
        help="read a cluster's load from its starsd.io/load-url annotation (http(s) only, no redirects) instead "
        "of its own draft Service; off by default, since whoever may edit a StarSDCluster then picks a URL the "
        "operator GETs (for tests and operators run outside the cluster)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here so `starsd --help` does not pay for kopf and the Kubernetes client.
    from starsd_operator.main import Options
    from starsd_operator.main import run as run_operator

    port = args.liveness_url_port if args.liveness_url_port is not None else args.liveness_port
    run_operator(
        Options(
            namespace=args.namespace,
            liveness_port=port,
            metrics_port=args.metrics_port,
            tick_interval=args.interval,
            load_timeout=args.load_timeout,
            allow_load_url_annotation=args.allow_load_url_annotation,
            peering=args.peering,
            priority=args.priority,
        )
    )
    return 0
