"""A ``StarSDCluster`` spec as typed, defaulted values.

The API server already applies the CRD's defaults and rejects what its schema and CEL rules catch; parsing
here repeats the defaults (a test keeps both in step) so the operator never depends on a field being present,
and raises :class:`SpecError` with a field path for what would otherwise be a ``KeyError`` deep in a builder.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starsd import defaults

from . import disruption, lifecycle, modelsource, podtemplate, rollout
from .disruption import Disruption
from .errors import SpecError as SpecError  # re-exported: callers catch spec.SpecError
from .lifecycle import Lifecycle
from .modelsource import ModelSource
from .podtemplate import PodTemplate
from .rollout import Policy as RolloutPolicy

# Defaults and limits: starsd.defaults (crds/starsdcluster.yaml declares the same; tests/test_defaults.py checks).


@dataclass(frozen=True)
class Placement:
    """Scheduling and resources of a pod: copied verbatim into the pod spec."""

    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)


# A positive Kubernetes quantity (the CRD's sizeLimits pattern).
QUANTITY = re.compile(r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[kMGTPE])?$")


@dataclass(frozen=True)
class SizeLimits:
    """``sizeLimits`` of a role: the most its pods' emptyDir volumes may hold (the kubelet evicts a pod over it)."""

    tmp: str = defaults.TMP_SIZE_LIMIT  # /tmp: HOME and its caches
    shm: str = defaults.SHM_SIZE_LIMIT  # /dev/shm of a GPU pod (memory-backed: counts as the pod's memory)
    model: str = defaults.MODEL_SIZE_LIMIT  # a model downloaded into the pod (a uri source without a cache claim)


@dataclass(frozen=True)
class DraftSpec:
    model: ModelSource
    image: str | None = None
    placement: Placement = field(default_factory=Placement)
    dtype: str = "auto"  # the pod's device: cuda when its container asks for a GPU, else cpu (podspec)
    max_batch: int = defaults.DRAFT_MAX_BATCH  # requests drafted together per step
    schedule: str = defaults.DRAFT_SCHEDULES[0]
    pod_template: PodTemplate | None = None  # merged into the operator's pod (see .podtemplate)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)  # probes and grace period (see .lifecycle)
    disruption: Disruption = field(default_factory=Disruption)  # its PodDisruptionBudget (see .disruption)
    replicas: int = defaults.DRAFT_REPLICAS  # draft pods; targets find them live (see starsd.rendezvous)
    size_limits: SizeLimits = field(default_factory=SizeLimits)


@dataclass(frozen=True)
class TargetSpec:
    model: ModelSource
    image: str | None = None
    gamma: int = defaults.GAMMA  # draft tokens proposed per round
    adaptive_gamma: bool = False  # each completion picks its gamma per round, at most ``gamma``
    dtype: str = "auto"
    max_num_seqs: int = defaults.MAX_NUM_SEQS  # completions per target at once, batched per step
    kv_cache_tokens: int | None = None  # None: the target sizes its cache (a GPU's memory, or full contexts)
    max_prefill_tokens: int = defaults.MAX_PREFILL_TOKENS
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    rollout: RolloutPolicy = field(default_factory=RolloutPolicy)  # how a change rolls (see .rollout)
    size_limits: SizeLimits = field(default_factory=SizeLimits)  # every pool's pods


@dataclass(frozen=True)
class PoolSpec:
    """One GPU node pool: one StatefulSet of targets."""

    name: str
    weight: int = defaults.POOL_WEIGHT  # share of the total target count
    min_replicas: int = defaults.POOL_MIN_REPLICAS
    max_replicas: int = defaults.POOL_MAX_REPLICAS
    placement: Placement = field(default_factory=Placement)
    model: ModelSource | None = None  # None: the target's model (spec.target.model)
    pod_template: PodTemplate | None = None
    disruption: Disruption = field(default_factory=Disruption)
    # starsd: `starsd target`; vllm: `vllm serve` with StarSD's proposer (see .vllmpool, docs/vllm.md).
    engine: str = defaults.ENGINES[0]
    image: str | None = None  # a vllm pool's image (required there); a starsd pool runs spec.target.image
    vllm_args: tuple[str, ...] = ()  # appended to a vllm pool's `vllm serve` (spec.pools[].vllm.args)

    @property
    def is_vllm(self) -> bool:
        return self.engine == VLLM


VLLM = "vllm"
# `vllm serve` flags the operator sets itself, refused in a pool's vllm.args (the CRD's CEL rule lists the same):
# the port the Services route to, the name the pool serves, the proposer, and the model (the positional path).
VLLM_OPERATOR_FLAGS = ("--port", "--served-model-name", "--speculative-config", "--model")


def vllm_flag(arg: str) -> str:
    """The flag an argument sets, as vLLM reads it: ``--a_b=1`` and ``--a-b.c`` both set ``--a-b``."""
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


@dataclass(frozen=True)
class RatePolicySpec:
    """``{type: Pods|Percent, value, periodSeconds}``, as in an HPA's behavior."""

    type: str
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    """``autoscaling.scaleUp`` / ``scaleDown``."""

    stabilization_window_seconds: int
    max_step: int  # most targets added or removed by one decision
    policies: tuple[RatePolicySpec, ...] = ()
    select_policy: str = "Max"


@dataclass(frozen=True)
class AutoscalingSpec:
    enabled: bool = False
    min_targets: int = defaults.MIN_TARGETS
    max_targets: int = defaults.MAX_TARGETS
    min_drafts: int = defaults.MIN_DRAFTS  # the bounds of spec.draft.replicas while autoscaling is enabled
    max_drafts: int = defaults.MAX_DRAFTS
    # The draft is under-loaded below this utilisation (it idles: more targets would feed it).
    underloaded_utilization: float = defaults.UNDERLOADED_UTILIZATION
    # The draft is saturated at or above this utilisation while requests queue at it.
    saturated_utilization: float = defaults.SATURATED_UTILIZATION
    # Targets below this batch occupancy, nothing waiting, are idle (scale in toward minTargets).
    scale_in_occupancy: float = defaults.SCALE_IN_OCCUPANCY
    # Targets at or above this occupancy, or with requests waiting, are saturated (scale out toward N*).
    saturated_occupancy: float = defaults.SATURATED_OCCUPANCY
    tolerance: float = defaults.TOLERANCE
    # A saturated draft may take targets away while requests wait at the targets (the user's opt-in).
    scale_in_while_waiting: bool = False
    scale_up: ScalingRules = field(
        default_factory=lambda: ScalingRules(defaults.SCALE_UP_WINDOW_SECONDS, defaults.SCALE_UP_MAX_STEP)
    )
    scale_down: ScalingRules = field(
        default_factory=lambda: ScalingRules(defaults.SCALE_DOWN_WINDOW_SECONDS, defaults.SCALE_DOWN_MAX_STEP)
    )
    convergence_timeout_seconds: int = defaults.CONVERGENCE_TIMEOUT_SECONDS


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of a Secret in the cluster's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class AuthSpec:
    """``spec.auth``: the keys the targets' OpenAI routes accept (see .apikey)."""

    api_key_secret: SecretKeyRef | None = None  # None: the targets take calls without a key


@dataclass(frozen=True)
class NetworkSpec:
    """``spec.network``: who may reach the targets' HTTP port (see .network)."""

    # NetworkPolicy peers (namespaceSelector and/or podSelector), as given; None: the cluster's own namespace.
    clients: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class ClusterSpec:
    draft: DraftSpec
    target: TargetSpec
    replicas: int  # spec.targets.replicas: the total target count (the scale subresource)
    pools: tuple[PoolSpec, ...]
    autoscaling: AutoscalingSpec = field(default_factory=AutoscalingSpec)
    image_policy: str = defaults.IMAGE_POLICIES[0]  # Pinned | FollowOperator (see imagepolicy.py)
    auth: AuthSpec = field(default_factory=AuthSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)


def parse(spec: Mapping[str, Any]) -> ClusterSpec:
    """Parse ``spec`` (as stored, defaults applied or not) into a :class:`ClusterSpec`."""
    draft = _mapping(spec, "draft", "spec")
    target = _mapping(spec, "target", "spec")
    gamma = _int(target, "gamma", "spec.target", defaults.GAMMA, minimum=defaults.GAMMA_MIN)
    if gamma > defaults.GAMMA_MAX:
        raise SpecError(f"spec.target.gamma must be in {defaults.GAMMA_MIN}..{defaults.GAMMA_MAX}, got {gamma}")
    pools_raw = spec.get("pools") or []
    if not isinstance(pools_raw, list) or not pools_raw:
        raise SpecError("spec.pools must list at least one pool")
    pools = tuple(_pool(p, f"spec.pools[{i}]") for i, p in enumerate(pools_raw))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise SpecError(f"spec.pools names must be unique, got {names}")
    targets = spec.get("targets") or {}
    autoscaling = _autoscaling(spec.get("autoscaling") or {})
    drafts = _draft_replicas(draft, autoscaling)
    return ClusterSpec(
        draft=DraftSpec(
            model=_model(draft, "spec.draft"),
            image=_optional_str(draft, "image", "spec.draft"),
            placement=_placement(draft, "spec.draft"),
            dtype=_choice(draft, "dtype", "spec.draft", defaults.DTYPES),
            max_batch=_int(draft, "maxBatch", "spec.draft", defaults.DRAFT_MAX_BATCH, minimum=1),
            schedule=_choice(draft, "schedule", "spec.draft", defaults.DRAFT_SCHEDULES),
            pod_template=_pod_template(draft, "spec.draft"),
            lifecycle=lifecycle.parse(draft, "spec.draft"),
            disruption=disruption.parse(draft, "spec.draft"),
            replicas=drafts,
            size_limits=_size_limits(draft, "spec.draft"),
        ),
        target=TargetSpec(
            model=_model(target, "spec.target"),
            image=_optional_str(target, "image", "spec.target"),
            gamma=gamma,
            adaptive_gamma=_bool(target, "adaptiveGamma", "spec.target"),
            dtype=_choice(target, "dtype", "spec.target", defaults.DTYPES),
            max_num_seqs=_int(target, "maxNumSeqs", "spec.target", defaults.MAX_NUM_SEQS, minimum=1),
            kv_cache_tokens=_int(target, "kvCacheTokens", "spec.target", 0, minimum=0) or None,
            max_prefill_tokens=_int(target, "maxPrefillTokens", "spec.target", defaults.MAX_PREFILL_TOKENS, minimum=1),
            lifecycle=lifecycle.parse(target, "spec.target"),
            rollout=rollout.parse(target, "spec.target"),
            size_limits=_size_limits(target, "spec.target"),
        ),
        replicas=_int(targets, "replicas", "spec.targets", defaults.TARGET_REPLICAS, minimum=0),
        pools=pools,
        autoscaling=autoscaling,
        image_policy=_choice(spec, "imagePolicy", "spec", defaults.IMAGE_POLICIES),
        auth=_auth(spec.get("auth")),
        network=_network(spec.get("network")),
    )


def _auth(raw: Any) -> AuthSpec:
    where = "spec.auth"
    if raw is None:
        return AuthSpec()
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    ref = raw.get("apiKeySecretRef")
    if ref is None:
        return AuthSpec()
    at = f"{where}.apiKeySecretRef"
    if not isinstance(ref, Mapping):
        raise SpecError(f"{at} must be an object")
    name, key = ref.get("name"), ref.get("key")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{at}.name is required (the Secret holding the API keys)")
    if not isinstance(key, str) or not key:
        raise SpecError(f"{at}.key is required (the Secret's key holding the API keys)")
    return AuthSpec(api_key_secret=SecretKeyRef(name=name, key=key))


PEER_SELECTORS = ("namespaceSelector", "podSelector")


def _network(raw: Any) -> NetworkSpec:
    where = "spec.network"
    if raw is None:
        return NetworkSpec()
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    clients = raw.get("clients")
    if clients is None:
        return NetworkSpec()
    if not isinstance(clients, list) or not clients:
        raise SpecError(f"{where}.clients must list at least one client (leave it out for the cluster's namespace)")
    peers = []
    for i, peer in enumerate(clients):
        at = f"{where}.clients[{i}]"
        if not isinstance(peer, Mapping) or not peer:
            raise SpecError(f"{at} must be an object with namespaceSelector and/or podSelector")
        unknown = sorted(set(peer) - set(PEER_SELECTORS))
        if unknown:
            raise SpecError(f"{at}: unknown field {unknown[0]} (namespaceSelector and podSelector are allowed)")
        for name, selector in peer.items():
            if not isinstance(selector, Mapping):
                raise SpecError(f"{at}.{name} must be a label selector (matchLabels, matchExpressions)")
        peers.append({k: copy.deepcopy(dict(peer[k])) for k in PEER_SELECTORS if k in peer})
    return NetworkSpec(clients=tuple(peers))


def _draft_replicas(draft: Mapping[str, Any], autoscaling: AutoscalingSpec) -> int:
    """``spec.draft.replicas``: within its range, and within minDrafts..maxDrafts while autoscaling is enabled
    (the CRD's CEL rule; repeated here for an API server that does not run it)."""
    lo, hi = defaults.DRAFT_REPLICAS_MIN, defaults.DRAFT_REPLICAS_MAX
    value = _int(draft, "replicas", "spec.draft", defaults.DRAFT_REPLICAS, minimum=lo)
    if value > hi:
        raise SpecError(f"spec.draft.replicas must be in {lo}..{hi}, got {value}")
    a = autoscaling
    if a.enabled and not a.min_drafts <= value <= a.max_drafts:
        raise SpecError(
            f"spec.draft.replicas ({value}) must be within spec.autoscaling.minDrafts..maxDrafts"
            f" ({a.min_drafts}..{a.max_drafts}) while autoscaling is enabled"
        )
    return value


def _choice(raw: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...]) -> str:
    """``raw[key]`` if it is one of ``choices`` (the first is the default when absent)."""
    value = raw.get(key, choices[0])
    if value not in choices:
        raise SpecError(f"{where}.{key} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _pool(raw: Any, where: str) -> PoolSpec:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}.name is required")
    lo = _int(raw, "minReplicas", where, defaults.POOL_MIN_REPLICAS, minimum=0)
    hi = _int(raw, "maxReplicas", where, defaults.POOL_MAX_REPLICAS, minimum=0)
    if lo > hi:
        raise SpecError(f"{where}: minReplicas ({lo}) must be <= maxReplicas ({hi})")
    engine = _choice(raw, "engine", where, defaults.ENGINES)
    image = _optional_str(raw, "image", where)
    return PoolSpec(
        name=name,
        weight=_int(raw, "weight", where, defaults.POOL_WEIGHT, minimum=0),
        min_replicas=lo,
        max_replicas=hi,
        placement=_placement(raw, where),
        model=_model(raw, where) if raw.get("model") is not None else None,
        pod_template=_pod_template(raw, where),
        disruption=disruption.parse(raw, where),
        engine=engine,
        image=_engine_image(engine, image, name, where),
        vllm_args=_vllm_args(raw, engine, name, where),
    )


def _engine_image(engine: str, image: str | None, pool: str, where: str) -> str | None:
    """A vllm pool's image (required); a starsd pool has none of its own (the CRD's CEL rules say the same)."""
    if engine == VLLM and image is None:
        raise SpecError(
            f"{where}.image: pool {pool}: engine vllm needs an image (a vLLM image with the starsd package installed,"
            " docs/vllm.md)"
        )
    if engine != VLLM and image is not None:
        raise SpecError(
            f"{where}.image: pool {pool}: image applies to engine vllm only (a starsd pool runs spec.target.image)"
        )
    return image


def _vllm_args(raw: Mapping[str, Any], engine: str, pool: str, where: str) -> tuple[str, ...]:
    block = raw.get("vllm")
    if block is None:
        return ()
    at = f"{where}.vllm"
    if engine != VLLM:
        raise SpecError(f"{at}: pool {pool}: vllm applies to engine vllm only")
    if not isinstance(block, Mapping):
        raise SpecError(f"{at} must be an object")
    args = block.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SpecError(f"{at}.args must be a list of strings")
    if len(args) > defaults.VLLM_ARGS_MAX:
        raise SpecError(f"{at}.args may hold at most {defaults.VLLM_ARGS_MAX} arguments, got {len(args)}")
    for i, arg in enumerate(args):
        if vllm_flag(arg) in VLLM_OPERATOR_FLAGS:
            raise SpecError(
                f"{at}.args[{i}]: {arg.split('=', 1)[0]} is set by the operator (the port the Services route to, the"
                " served model name, the speculative config and the model come from the spec)"
            )
    return tuple(args)


MIN_TARGETS_MESSAGE = (
    "spec.autoscaling.minTargets must be at least 1: with no target, nothing reports demand to the draft, so the"
    " rebalancer could never scale the cluster back up (docs/rebalancer.md); set spec.targets.replicas to 0 by"
    " hand to stop a cluster"
)


def _autoscaling(raw: Mapping[str, Any]) -> AutoscalingSpec:
    where = "spec.autoscaling"
    lo = _int(raw, "minTargets", where, defaults.MIN_TARGETS, minimum=0)
    if lo < 1:
        raise SpecError(MIN_TARGETS_MESSAGE)
    hi = _int(raw, "maxTargets", where, defaults.MAX_TARGETS, minimum=0)
    if lo > hi:
        raise SpecError(f"{where}: minTargets ({lo}) must be <= maxTargets ({hi})")
    lo_d = _int(raw, "minDrafts", where, defaults.MIN_DRAFTS, minimum=defaults.DRAFT_REPLICAS_MIN)
    hi_d = _int(raw, "maxDrafts", where, defaults.MAX_DRAFTS, minimum=defaults.DRAFT_REPLICAS_MIN)
    for key, value in (("minDrafts", lo_d), ("maxDrafts", hi_d)):
        if value > defaults.DRAFT_REPLICAS_MAX:
            raise SpecError(f"{where}.{key} must be <= {defaults.DRAFT_REPLICAS_MAX}, got {value}")
    if lo_d > hi_d:
        raise SpecError(f"{where}: minDrafts ({lo_d}) must be <= maxDrafts ({hi_d})")
    up = _fraction(raw, "underloadedUtilization", where, defaults.UNDERLOADED_UTILIZATION)
    down = _fraction(raw, "saturatedUtilization", where, defaults.SATURATED_UTILIZATION)
    if up >= down:
        raise SpecError(f"{where}: underloadedUtilization ({up}) must be < saturatedUtilization ({down})")
    idle = _fraction(raw, "scaleInOccupancy", where, defaults.SCALE_IN_OCCUPANCY)
    busy = _fraction(raw, "saturatedOccupancy", where, defaults.SATURATED_OCCUPANCY)
    if idle >= busy:
        raise SpecError(f"{where}: scaleInOccupancy ({idle}) must be < saturatedOccupancy ({busy})")
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        raise SpecError(f"{where}.enabled must be a boolean")
    return AutoscalingSpec(
        enabled=enabled,
        min_targets=lo,
        max_targets=hi,
        min_drafts=lo_d,
        max_drafts=hi_d,
        underloaded_utilization=up,
        saturated_utilization=down,
        scale_in_occupancy=idle,
        saturated_occupancy=busy,
        tolerance=_fraction(raw, "tolerance", where, defaults.TOLERANCE),
        scale_in_while_waiting=_bool(raw, "scaleInWhileWaiting", where),
        scale_up=_rules(raw, "scaleUp", defaults.SCALE_UP_WINDOW_SECONDS, defaults.SCALE_UP_MAX_STEP),
        scale_down=_rules(raw, "scaleDown", defaults.SCALE_DOWN_WINDOW_SECONDS, defaults.SCALE_DOWN_MAX_STEP),
        convergence_timeout_seconds=_int(
            raw, "convergenceTimeoutSeconds", where, defaults.CONVERGENCE_TIMEOUT_SECONDS, minimum=0
        ),
    )


def _rules(parent: Mapping[str, Any], key: str, window: int, step: int) -> ScalingRules:
    where = f"spec.autoscaling.{key}"
    raw = parent.get(key) or {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    policies_raw = raw.get("policies") or []
    if not isinstance(policies_raw, list):
        raise SpecError(f"{where}.policies must be a list")
    policies = []
    for i, p in enumerate(policies_raw):
        at = f"{where}.policies[{i}]"
        if not isinstance(p, Mapping):
            raise SpecError(f"{at} must be an object")
        policies.append(
            RatePolicySpec(
                type=_choice(p, "type", at, defaults.RATE_POLICY_TYPES),
                value=_int(p, "value", at, 1, minimum=1),
                period_seconds=_int(p, "periodSeconds", at, 60, minimum=1),
            )
        )
    return ScalingRules(
        stabilization_window_seconds=_int(raw, "stabilizationWindowSeconds", where, window, minimum=0),
        max_step=_int(raw, "maxStep", where, step, minimum=1),
        policies=tuple(policies),
        select_policy=_choice(raw, "selectPolicy", where, defaults.SELECT_POLICIES),
    )


def _model(parent: Mapping[str, Any], where: str) -> ModelSource:
    return modelsource.parse(parent.get("model"), f"{where}.model")


def _size_limits(parent: Mapping[str, Any], where: str) -> SizeLimits:
    raw = parent.get("sizeLimits") or {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}.sizeLimits must be an object")
    given = {}
    for key in ("tmp", "shm", "model"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not QUANTITY.match(value) or not re.search(r"[1-9]", value):
            raise SpecError(f"{where}.sizeLimits.{key} must be a positive quantity such as 2Gi, got {value!r}")
        given[key] = value
    return SizeLimits(**given)


def _pod_template(parent: Mapping[str, Any], where: str) -> PodTemplate | None:
    return podtemplate.parse(parent.get("podTemplate"), f"{where}.podTemplate")


def _placement(parent: Mapping[str, Any], where: str) -> Placement:
    resources = parent.get("resources") or {}
    node_selector = parent.get("nodeSelector") or {}
    tolerations = parent.get("tolerations") or []
    if not isinstance(resources, Mapping):
        raise SpecError(f"{where}.resources must be an object")
    if not isinstance(node_selector, Mapping) or not all(isinstance(v, str) for v in node_selector.values()):
        raise SpecError(f"{where}.nodeSelector must map label keys to strings")
    if not isinstance(tolerations, list) or not all(isinstance(t, Mapping) for t in tolerations):
        raise SpecError(f"{where}.tolerations must be a list of objects")
    return Placement(
        resources={k: dict(v) for k, v in resources.items() if isinstance(v, Mapping)},
        node_selector=dict(node_selector),
        tolerations=[dict(t) for t in tolerations],
    )


def _mapping(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}.{key} is required")
    return value


def _optional_str(parent: Mapping[str, Any], key: str, where: str) -> str | None:
    value = parent.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SpecError(f"{where}.{key} must be a string")
    return value


def _bool(parent: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = parent.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{where}.{key} must be a boolean, got {value!r}")
    return value


def _int(parent: Mapping[str, Any], key: str, where: str, default: int, *, minimum: int) -> int:
    value = parent.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{where}.{key} must be >= {minimum}, got {value}")
    return value


def _fraction(parent: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = parent.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise SpecError(f"{where}.{key} must be a number in [0, 1], got {value!r}")
    return float(value)
