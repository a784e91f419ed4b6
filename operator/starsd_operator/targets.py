"""The targets: one StatefulSet and headless Service per node pool, one client Service over all of them."""

from __future__ import annotations

from typing import Any

from starsd import defaults

from . import apikey, naming, podspec, podtemplate, rollout, vllmpool
from . import constants as c
from .modelsource import ModelSource
from .naming import Owner
from .spec import ClusterSpec, PoolSpec


def statefulset(
    owner: Owner,
    spec: ClusterSpec,
    pool: PoolSpec,
    replicas: int,
    images: podspec.Images,
    partition: int = 0,
    *,
    api_key: apikey.KeyState | None = None,
) -> dict[str, Any]:
    """The pool's targets; ``replicas`` is the pool's share of the total (see :mod:`.pools`), ``partition`` the
    lowest ordinal that runs this template (see :mod:`.rollout`). The template's hash is kept in an annotation,
    so the next change knows which pools it changes before the StatefulSet controller has seen it. With
    ``spec.auth``, the container takes its API key from the Secret and the template carries the key's digest
    from ``api_key`` (see :mod:`.apikey`)."""
    target = spec.target
    model = pool.model or target.model  # a pool may run its own copy (another quantisation, say)
    name = naming.pool_name(owner, pool.name)
    container = (
        _vllm_container(owner, spec, pool, model)
        if pool.is_vllm
        else _starsd_container(owner, spec, pool, model, images)
    )
    template = podspec.settle_serving(
        podtemplate.merge(
            {
                "metadata": {
                    "labels": naming.labels(owner, c.COMPONENT_TARGET, pool.name),
                    **({"annotations": notes} if (notes := apikey.template_annotations(api_key)) else {}),
                },
                "spec": podspec.pod_spec(
                    container_spec=container,
                    model=model,
                    placement=pool.placement,
                    lc=target.lifecycle,
                    sizes=target.size_limits,
                ),
            },
            pool.pod_template,
        ),
        {"cpu": defaults.TARGET_CPU_REQUEST, "memory": defaults.TARGET_MEMORY_REQUEST},
    )
    metadata = naming.metadata(owner, name, c.COMPONENT_TARGET, pool.name)
    metadata["annotations"] = {rollout.ANNOTATION_TEMPLATE_HASH: rollout.template_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            # Targets are independent of each other: start and stop them all at once.
            "podManagementPolicy": "Parallel",
            # A change rolls one pool at a time, one pod at a time: the operator moves the partition.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
            "minReadySeconds": target.rollout.min_ready_seconds,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": naming.selector_labels(owner, c.COMPONENT_TARGET, pool.name)},
            "template": template,
        },
    }


def _starsd_container(
    owner: Owner, spec: ClusterSpec, pool: PoolSpec, model: ModelSource, images: podspec.Images
) -> dict[str, Any]:
    """``starsd target``: a pool's engine by default."""
    target = spec.target
    return podspec.container(
        name=c.COMPONENT_TARGET,
        image=target.image or images.target,
        command=[
            "starsd",
            "target",
            "--model",
            model.serve_path,
            # The drafts' headless Service: the target finds the ready drafts itself and picks its own by
            # rendezvous hashing of its id. Nothing here depends on the draft count, so changing it rolls no
            # target (docs/architecture.md, "Several drafts").
            "--drafts-from",
            naming.drafts_source(owner),
            "--port",
            str(c.TARGET_HTTP_PORT),
            "--gamma",
            str(target.gamma),
            *(["--adaptive-gamma"] if target.adaptive_gamma else []),
            "--device",
            podspec.device_for(pool.placement.resources),
            "--dtype",
            target.dtype,
            "--max-num-seqs",
            str(target.max_num_seqs),
            "--max-prefill-tokens",
            str(target.max_prefill_tokens),
            *(["--kv-cache-tokens", str(target.kv_cache_tokens)] if target.kv_cache_tokens else []),
            # Kubernetes expands $(POD_NAME) from the container's env: each target's id is its pod name.
            "--id",
            "$(POD_NAME)",
        ],
        ports=[{"name": "http", "containerPort": c.TARGET_HTTP_PORT, "protocol": "TCP"}],
        probe_port="http",
        model=model,
        resources=pool.placement.resources,
        extra_env=[{"name": "STARSD_POOL", "value": pool.name}, *apikey.env(spec.auth)],
        lc=target.lifecycle,
        drain=True,
        sizes=target.size_limits,
    )


def _vllm_container(owner: Owner, spec: ClusterSpec, pool: PoolSpec, model: ModelSource) -> dict[str, Any]:
    """``vllm serve`` with StarSD's proposer (:mod:`.vllmpool`): the same port, model, resources and lifecycle
    budget as a StarSD target; probes on vLLM's ``/health``; no drain hook (vLLM has no ``/drain``)."""
    target = spec.target
    assert pool.image is not None  # the parser refuses a vllm pool without one
    return podspec.container(
        name=c.COMPONENT_TARGET,
        image=pool.image,
        command=vllmpool.command(spec, model, pool.vllm_args),
        ports=[{"name": "http", "containerPort": c.TARGET_HTTP_PORT, "protocol": "TCP"}],
        probe_port="http",
        model=model,
        resources=pool.placement.resources,
        extra_env=[
            {"name": "STARSD_POOL", "value": pool.name},
            *vllmpool.env(owner),
            *apikey.env(spec.auth, defaults.VLLM_API_KEY_ENV),
        ],
        lc=target.lifecycle,
        sizes=target.size_limits,
        health=vllmpool.HEALTH_PATH,
    )


def headless_service(owner: Owner, pool: PoolSpec) -> dict[str, Any]:
    """The StatefulSet's governing Service: a stable DNS name per target pod, and what Prometheus scrapes the
    pool's pods through (``LABEL_SCRAPE``; the client Service selects the same pods and is not scraped)."""
    name = naming.pool_name(owner, pool.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.scraped(naming.metadata(owner, name, c.COMPONENT_TARGET, pool.name)),
        "spec": {
            "clusterIP": "None",
            "selector": naming.selector_labels(owner, c.COMPONENT_TARGET, pool.name),
            "ports": [{"name": "http", "port": c.TARGET_HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def client_service(owner: Owner) -> dict[str, Any]:
    """What clients call (the OpenAI API): every ready target of every pool."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": naming.metadata(owner, naming.client_service_name(owner), c.COMPONENT_TARGET),
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector_labels(owner, c.COMPONENT_TARGET),
            "ports": [
                {
                    "name": "http",
                    "port": c.TARGET_HTTP_PORT,
                    "targetPort": "http",
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }
