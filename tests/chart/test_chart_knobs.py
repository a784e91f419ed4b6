"""Every data-plane knob is reachable from the chart's sample cluster and the CR: set in values, it reaches
the StarSDCluster, and from there the pods' commands; and the CRD describes each one for kubectl explain."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starsd_operator import draft, spec, targets

from tests.operator import factories as f

from .conftest import Rendered

KNOBS = {
    "draft": ("dtype", "maxBatch", "schedule"),
    "target": ("gamma", "adaptiveGamma", "dtype", "maxNumSeqs", "kvCacheTokens", "maxPrefillTokens"),
}


def test_the_crd_describes_every_knob() -> None:
    props = f.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for component, names in KNOBS.items():
        for name in names:
            assert props[component]["properties"][name].get("description"), f"spec.{component}.{name}"


def test_knobs_set_in_values_reach_the_pods(render: Callable[..., Rendered]) -> None:
    sets = (
        "cluster.enabled=true",
        "cluster.draft.dtype=float16",
        "cluster.draft.maxBatch=16",
        "cluster.draft.schedule=fair",
        "cluster.target.adaptiveGamma=true",
        "cluster.target.dtype=bfloat16",
        "cluster.target.maxNumSeqs=128",
        "cluster.target.kvCacheTokens=90000",
        "cluster.target.maxPrefillTokens=256",
    )
    cluster = render(sets=sets).one("StarSDCluster")
    parsed = spec.parse(cluster["spec"])
    draft_sts = draft.deployment(f.OWNER, parsed, _images())
    draft_command = draft_sts["spec"]["template"]["spec"]["containers"][0]["command"]
    target_sts = targets.statefulset(f.OWNER, parsed, parsed.pools[0], 1, _images())
    target_command = target_sts["spec"]["template"]["spec"]["containers"][0]["command"]

    def flag(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    assert [flag(draft_command, n) for n in ("--dtype", "--max-batch", "--schedule")] == ["float16", "16", "fair"]
    assert "--adaptive-gamma" in target_command
    assert [flag(target_command, n) for n in ("--dtype", "--max-num-seqs", "--kv-cache-tokens")] == [
        "bfloat16",
        "128",
        "90000",
    ]
    assert flag(target_command, "--max-prefill-tokens") == "256"


def test_the_default_values_render_the_crds_defaults(render: Callable[..., Rendered]) -> None:
    cluster = render(sets=("cluster.enabled=true",)).one("StarSDCluster")
    parsed = spec.parse(cluster["spec"])
    defaults = spec.parse({k: v for k, v in cluster["spec"].items() if k in ("pools",)} | _models())
    assert (parsed.draft.dtype, parsed.draft.max_batch, parsed.draft.schedule) == (
        defaults.draft.dtype,
        defaults.draft.max_batch,
        defaults.draft.schedule,
    )
    assert parsed.target.kv_cache_tokens is None and not parsed.target.adaptive_gamma
    assert parsed.target.max_num_seqs == defaults.target.max_num_seqs


def _models() -> dict[str, Any]:
    return {"draft": {"model": {"path": "/d"}}, "target": {"model": {"path": "/t"}}}


def _images() -> Any:
    from starsd_operator.podspec import Images

    return Images()
