"""Every API request the operator makes, as RBAC rules: what the chart grants, exactly (tests/chart checks
that the chart's rules equal these, and e2e/ runs the whole suite under the chart's ServiceAccount).

Each rule names where the code makes the request. Children, pods and HPAs are watched (kopf indices,
handlers.WATCHED) and read from memory, the custom resource arrives through kopf's watch; the one ``get`` is
of the Secret a cluster's ``spec.auth.apiKeySecretRef`` names (Secrets are never listed or watched).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str
    verbs: frozenset[str]
    why: str
    clusterwide_only: bool = False  # needed only when the operator watches every namespace
    namespaced_only: bool = False  # needed only when it watches one namespace


def _p(
    group: str, resource: str, verbs: str, why: str, clusterwide_only: bool = False, namespaced_only: bool = False
) -> Permission:
    return Permission(group, resource, frozenset(verbs.split()), why, clusterwide_only, namespaced_only)


PERMISSIONS: tuple[Permission, ...] = (
    _p(
        "starsd.io",
        "starsdclusters",
        "list watch patch",
        "kopf's watch; kopf's finalizer and progress annotations; kube.swap_replicas (the rebalancer's JSON patch)",
    ),
    _p("starsd.io", "starsdclusters/status", "patch", "kopf's status patches (handlers.reconcile, tick)"),
    _p(
        "starsd.io",
        "starsdclusters/finalizers",
        "update",
        "owner references with blockOwnerDeletion on the "
        "children, where OwnerReferencesPermissionEnforcement is on (OpenShift)",
    ),
    _p(
        "apps",
        "deployments",
        "list watch create patch",
        "kube.apply (the drafts); handlers.WATCHED (controller.observe)",
    ),
    _p(
        "apps",
        "statefulsets",
        "list watch create patch delete",
        "kube.apply; handlers.WATCHED (controller.observe); controller._delete_stale (a pool left the spec); "
        "controller._replace_legacy_draft (an older operator's draft StatefulSet)",
    ),
    _p("", "services", "list watch create patch delete", "kube.apply; handlers.WATCHED; controller._delete_stale"),
    _p(
        "policy",
        "poddisruptionbudgets",
        "list watch create patch delete",
        "kube.apply; handlers.WATCHED; controller._delete_stale (a pool scaled to none, or left the spec)",
    ),
    _p("networking.k8s.io", "networkpolicies", "list watch create patch", "kube.apply; handlers.WATCHED"),
    _p("", "pods", "list watch", "handlers.WATCHED: controller.observe (readiness, the problems diagnose reports)"),
    _p(
        "",
        "secrets",
        "get",
        "apikey.observe: the Secret of spec.auth.apiKeySecretRef, by name (is it there; a digest of its key "
        "rolls the targets when it changes)",
    ),
    _p("", "events", "create", "kopf.event (handlers.post) and kopf's own warnings"),
    _p("autoscaling", "horizontalpodautoscalers", "list watch", "handlers.WATCHED: controller.external_autoscaler"),
    _p(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "list watch",
        "kopf's resource scanning (off when the operator watches one namespace: main.configure_settings)",
        clusterwide_only=True,
    ),
    _p(
        "kopf.dev",
        "clusterkopfpeerings",
        "list watch patch",
        "kopf's peering (--peering): watch the peers, keep this operator's entry alive",
        clusterwide_only=True,
    ),
    _p("kopf.dev", "kopfpeerings", "list watch patch", "kopf's peering in one namespace", namespaced_only=True),
)


def rules(*, clusterwide: bool) -> dict[tuple[str, str], frozenset[str]]:
    """(apiGroup, resource) -> verbs, for a ClusterRole (``clusterwide``) or a namespaced Role."""
    return {
        (p.group, p.resource): p.verbs
        for p in PERMISSIONS
        if (clusterwide and not p.namespaced_only) or (not clusterwide and not p.clusterwide_only)
    }
