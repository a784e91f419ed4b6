"""Every command line the operator puts in a pod is one the ``starsd`` CLI accepts.

Pods on the e2e suite's nodes never run, so a renamed or misspelt flag in a builder would pass every other
test and crash-loop every real pod. Here the children of a CR that sets every field reaching a command line
are built, and each ``starsd`` container's (and init container's) command goes through the CLI's own argparse
parser (:func:`starsd.cli.build_parser`, which parses and loads no model); the parsed values are the spec's.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from starsd_operator import children
from starsd_operator.podspec import Images
from starsd_operator.spec import parse

from starsd.cli import build_parser

from . import factories as f

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")
GPU = {"limits": {"nvidia.com/gpu": "1"}}


def rich_spec() -> dict[str, Any]:
    """Every spec field that reaches a command line, each away from its default."""
    return f.spec(
        draft={
            "model": {
                "uri": "hf://org/draft-model@main",
                "credentials": {"secretRef": {"name": "hf-token"}},
                "cache": {"claimName": "model-cache"},
            },
            "replicas": 2,
            "dtype": "bfloat16",
            "maxBatch": 48,
            "schedule": "fair",
            "resources": GPU,
        },
        target={
            "model": {"uri": "s3://bucket/target.tar.gz", "credentials": {"secretRef": {"name": "s3-keys"}}},
            "gamma": 7,
            "adaptiveGamma": True,
            "dtype": "float16",
            "maxNumSeqs": 96,
            "maxPrefillTokens": 1024,
            "kvCacheTokens": 65536,
        },
        pools=[
            {"name": "h100", "weight": 2, "maxReplicas": 8, "resources": GPU},
            {"name": "l4", "weight": 1, "maxReplicas": 8, "model": {"pvc": {"claimName": "l4-models"}}},
        ],
    )


def starsd_commands(objs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """``(where, argv after 'starsd')`` of every container and init container that runs ``starsd``."""
    found = []
    for obj in objs:
        template = obj.get("spec", {}).get("template", {}).get("spec")
        if not template:
            continue
        for kind in ("initContainers", "containers"):
            for container in template.get(kind) or []:
                argv = [*(container.get("command") or []), *(container.get("args") or [])]
                if argv and argv[0] == "starsd":
                    found.append((f"{obj['metadata']['name']}/{container['name']}", argv[1:]))
    return found


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """``argv`` through the CLI's own parser; an unknown flag or a bad value fails the test with argparse's words."""
    parser = build_parser(argv)
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"`starsd {' '.join(argv)}` is refused by the CLI (exit {exc.code})") from None


def test_every_starsd_command_line_in_the_children_parses() -> None:
    spec = parse(rich_spec())
    commands = starsd_commands(children.desired(f.OWNER, spec, IMAGES))
    by_sub: dict[str, list[argparse.Namespace]] = {}
    for _, argv in commands:
        by_sub.setdefault(argv[0], []).append(parse_cli(argv))
    # The draft, each pool's target and each uri model's download: nothing that runs starsd is missed.
    assert sorted((sub, len(parsed)) for sub, parsed in by_sub.items()) == [
        ("draft", 1),
        ("fetch-model", 2),  # the draft's model and the h100 pool's (the l4 pool's comes from a claim)
        ("target", 2),
    ], commands
    [drafted] = by_sub["draft"]
    assert (drafted.dtype, drafted.max_batch, drafted.schedule) == ("bfloat16", 48, "fair")
    for t in by_sub["target"]:
        assert (t.gamma, t.adaptive_gamma, t.dtype) == (7, True, "float16")
        assert (t.max_num_seqs, t.max_prefill_tokens, t.kv_cache_tokens) == (96, 1024, 65536)
        assert t.id == "$(POD_NAME)"
        # the drafts' headless Service, whatever their count: a new draft count restarts no target
        assert (t.draft, t.drafts_from) == ("", "dns:chat-draft-pods.ml.svc:50051")


def test_the_default_spec_and_the_shipped_example_parse_too() -> None:
    for raw in (f.spec(), f.sample()["spec"]):
        commands = starsd_commands(children.desired(f.OWNER, parse(raw), IMAGES))
        assert {argv[0] for _, argv in commands} == {"draft", "target"}
        for _, argv in commands:
            parse_cli(argv)


def test_a_flag_the_cli_does_not_know_fails_the_check() -> None:
    """The check above can fail: a renamed flag (``--max-batch`` spelt ``--max-batch-size``) is refused."""
    [(_, argv)] = [c for c in starsd_commands(children.desired(f.OWNER, parse(f.spec()), IMAGES)) if c[1][0] == "draft"]
    renamed = ["--max-batch-size" if a == "--max-batch" else a for a in argv]
    with pytest.raises(AssertionError, match="refused by the CLI"):
        parse_cli(renamed)
