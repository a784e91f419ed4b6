"""What each model source adds to a pod: volumes, mounts, the downloader init container and its environment."""

from __future__ import annotations

from typing import Any

import pytest
from starsd_operator import draft, targets
from starsd_operator.modelsource import CACHE_ROOT, MODEL_ROOT
from starsd_operator.podspec import Images
from starsd_operator.spec import parse

from starsd import modeluri

from . import factories as f

IMAGES = Images(draft="reg/draft:1", target="reg/target:1")


def draft_pod(model: dict[str, Any]) -> dict[str, Any]:
    spec = parse(f.spec(draft={"model": model}))
    pod: dict[str, Any] = draft.deployment(f.OWNER, spec, IMAGES)["spec"]["template"]["spec"]
    return pod


def env_names(container: dict[str, Any]) -> list[str]:
    return [e["name"] for e in container["env"]]


def test_a_uri_is_downloaded_by_an_init_container_into_an_empty_dir() -> None:
    pod = draft_pod({"uri": "hf://org/draft@v1"})
    [init] = pod["initContainers"]
    [server] = pod["containers"]
    assert init["name"] == "fetch-model"
    assert init["image"] == server["image"] == "reg/draft:1"
    assert init["command"] == ["starsd", "fetch-model", "hf://org/draft@v1", MODEL_ROOT]
    assert {"name": "model", "emptyDir": {"sizeLimit": "100Gi"}} in pod["volumes"]
    assert {"name": "model", "mountPath": MODEL_ROOT} in init["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in init["volumeMounts"]
    assert {"name": "model", "mountPath": MODEL_ROOT, "readOnly": True} in server["volumeMounts"]
    assert server["command"][server["command"].index("--model") + 1] == MODEL_ROOT
    # The downloader reaches the network; the server stays offline.
    assert "HF_HUB_OFFLINE" not in env_names(init) and "HF_HUB_OFFLINE" in env_names(server)
    assert init["securityContext"] == server["securityContext"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_with_a_cache_claim_the_download_lands_in_a_folder_per_source_and_revision() -> None:
    uri = "s3://bucket/llama/int8"
    pod = draft_pod({"uri": uri, "cache": {"claimName": "model-cache"}})
    [init] = pod["initContainers"]
    [server] = pod["containers"]
    key = modeluri.cache_key(modeluri.parse(uri))
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in pod["volumes"]
    assert not any(v["name"] == "model" for v in pod["volumes"])
    assert init["command"][-1] == f"{CACHE_ROOT}/{key}"
    assert {"name": "model-cache", "mountPath": CACHE_ROOT} in init["volumeMounts"]
    assert {"name": "model-cache", "mountPath": MODEL_ROOT, "subPath": key, "readOnly": True} in server["volumeMounts"]


@pytest.mark.parametrize(
    ("uri", "required", "optional"),
    [
        ("hf://o/n", ["HF_TOKEN"], []),
        (
            "s3://bucket/p",
            ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
            ["AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"],
        ),
        ("gs://bucket/p", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"], ["STARSD_GCS_ENDPOINT"]),
        ("https://h/m.tar.gz", ["STARSD_HTTP_AUTHORIZATION"], []),
    ],
)
def test_credentials_reach_the_downloader_only(uri: str, required: list[str], optional: list[str]) -> None:
    pod = draft_pod({"uri": uri, "credentials": {"secretRef": {"name": "creds"}}})
    [init] = pod["initContainers"]
    [server] = pod["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e}
    assert refs == {key: {"name": "creds", "key": key, "optional": key in optional} for key in (*required, *optional)}
    assert not set(refs) & set(env_names(server))
    assert "envFrom" not in server


def test_without_credentials_the_downloader_reads_no_secret() -> None:
    [init] = draft_pod({"uri": "hf://o/n"})["initContainers"]
    assert not [e for e in init["env"] if "valueFrom" in e]


def test_a_model_in_the_image_or_on_a_claim_needs_no_downloader() -> None:
    assert "initContainers" not in draft_pod({"path": "/models/draft"})
    assert "initContainers" not in draft_pod({"pvc": {"claimName": "c"}})


def test_a_pool_runs_its_own_model_and_the_others_the_targets() -> None:
    spec = parse(
        f.spec(
            target={"model": {"uri": "hf://org/target@bf16"}},
            pools=[{"name": "h100"}, {"name": "l4", "model": {"uri": "hf://org/target@int8"}}],
        )
    )
    commands = {}
    for pool in spec.pools:
        sts = targets.statefulset(f.OWNER, spec, pool, 1, IMAGES)
        [init] = sts["spec"]["template"]["spec"]["initContainers"]
        commands[pool.name] = init["command"][2]
    assert commands == {"h100": "hf://org/target@bf16", "l4": "hf://org/target@int8"}


def test_a_failed_download_reads_as_the_downloaders_own_words() -> None:
    """What the kubelet reports for an init container that exited 1 and waits to run again."""
    from starsd_operator import diagnose

    said = "hf://org/draft: 401 Unauthorized: the token in HF_TOKEN was refused, or the repository does not exist"
    pod = {
        "metadata": {"name": "chat-draft-abc"},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "fetch-model",
                    "ready": False,
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": said}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "draft",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}},
                }
            ],
        },
    }
    problem = diagnose.first_problem([pod])
    assert problem is not None and problem.reason == "ContainerFailing"
    assert "container fetch-model" in problem.message and problem.message.endswith(said)
