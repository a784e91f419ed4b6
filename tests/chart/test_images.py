"""The Dockerfiles (pinned bases, a non-root user, the right entrypoint, a CPU/CUDA build argument) and the
commands `make images` runs (images/build.sh with DRY_RUN=1 prints them instead of running them)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pytest

from .conftest import REPO

DOCKERFILES = {
    "dataplane": REPO / "images" / "dataplane" / "Dockerfile",
    "operator": REPO / "images" / "operator" / "Dockerfile",
}
ROLES = {"draft": ["starsd", "draft"], "target": ["starsd", "target"]}


def stages(text: str) -> dict[str, str]:
    """Each named build stage's text, from its FROM line to the next."""
    parts = re.split(r"^(?=FROM )", text, flags=re.M)
    out = {}
    for part in parts[1:]:
        name = re.match(r"FROM \S+(?: AS (\S+))?", part)
        assert name
        out[name[1] or f"unnamed{len(out)}"] = part
    return out


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_pins_its_base_and_runs_as_non_root(image: str) -> None:
    text = DOCKERFILES[image].read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base, "the base image is one pinned build argument"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base[1]), base[1]
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(bases) >= 2 and all(b in {"${PYTHON_IMAGE}", "runtime"} for b in bases), "multi-stage, same base"
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    assert "-c requirements.lock" in text, "installs at the locked versions"


def test_the_operator_image_runs_starsd() -> None:
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", DOCKERFILES["operator"].read_text(), re.M)
    assert entrypoint and json.loads(entrypoint[1]) == ["starsd"]


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_is_a_metadata_only_stage_over_the_shared_runtime(role: str) -> None:
    """The draft and target images differ only in their last stage, which adds no file: every layer is shared."""
    stage = stages(DOCKERFILES["dataplane"].read_text())[role]
    assert stage.startswith(f"FROM runtime AS {role}\n")
    instructions = {line.split()[0] for line in stage.splitlines()[1:] if line and not line[0].isspace()}
    assert instructions - {"#", "ARG", "LABEL", "EXPOSE", "ENTRYPOINT", "CMD"} == set(), instructions
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.M)
    assert entrypoint and json.loads(entrypoint[1]) == ROLES[role]
    cmd = re.search(r"^CMD (\[.*\])$", stage, re.M)
    assert cmd and f"/models/{role}" in json.loads(cmd[1])
    assert f'org.opencontainers.image.title="starsd-{role}"' in stage


def test_the_data_plane_image_has_a_cuda_release_and_a_cpu_variant() -> None:
    text = DOCKERFILES["dataplane"].read_text()
    assert "ARG VARIANT=cuda" in text and "ARG VARIANT=cpu" not in text, "the default build is the release (CUDA)"
    assert re.search(r"^\s+cpu\)", text, re.M) and re.search(r"^\s+cuda\)", text, re.M)


def build_commands(*names: str, **env: str) -> list[list[str]]:
    """The commands images/build.sh would run, parsed; fails when the script refuses."""
    proc = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh"), *names],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()]


def tags(command: list[str]) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command) if arg == "-t"]


def test_make_images_with_a_registry_and_push_builds_tags_and_pushes_the_three_release_images() -> None:
    commands = build_commands(REGISTRY="registry.example.com/team", PUSH="1")
    builds = [c for c in commands if c[:2] == ["docker", "build"]]
    pushes = [c for c in commands if c[:2] == ["docker", "push"]]
    assert len(builds) == 3 and commands[3:] == pushes, "every image is built before any is pushed"
    for command, name in zip(builds, ["operator", "draft", "target"], strict=True):
        assert tags(command) == [
            f"starsd/{name}:0.1.0",
            f"starsd/{name}:dev",
            f"registry.example.com/team/starsd/{name}:0.1.0",
        ]
        assert command[-1] == str(REPO)
    assert builds[0][builds[0].index("-f") + 1] == str(DOCKERFILES["operator"])
    for command, role in zip(builds[1:], ["draft", "target"], strict=True):
        assert command[command.index("-f") + 1] == str(DOCKERFILES["dataplane"])
        assert command[command.index("--target") + 1] == role
        assert "VARIANT=cuda" in command, "the release's data-plane images are the CUDA build"
    assert [p[2] for p in pushes] == [
        f"registry.example.com/team/starsd/{n}:0.1.0" for n in ("operator", "draft", "target")
    ]


def test_without_push_nothing_is_pushed_and_without_a_registry_nothing_is_named_after_one() -> None:
    built_only = build_commands(REGISTRY="registry.example.com/team")
    assert [c[:2] for c in built_only] == [["docker", "build"]] * 3
    local = build_commands()
    assert [tags(c) for c in local] == [
        [f"starsd/{n}:0.1.0", f"starsd/{n}:dev"] for n in ("operator", "draft", "target")
    ]


def test_the_cpu_variant_carries_the_cpu_suffix_and_the_operator_none() -> None:
    commands = build_commands("operator", "draft", VARIANT="cpu", IMAGE_TAG="1.2.3")
    assert tags(commands[0])[0] == "starsd/operator:1.2.3"
    assert tags(commands[1])[0] == "starsd/draft:1.2.3-cpu" and "VARIANT=cpu" in commands[1]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PUSH": "1"}, "PUSH=1 needs REGISTRY"),
        ({"REGISTRY": "https://registry.example.com/"}, "REGISTRY must be a registry host and path"),
        ({"VARIANT": "auto"}, "VARIANT must be cuda (the release) or cpu"),
        ({"PUSH": "yes", "REGISTRY": "r.example"}, "PUSH must be 1 or unset"),
    ],
)
def test_settings_that_cannot_work_are_refused_before_anything_is_built(env: dict[str, str], message: str) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh")],
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and proc.stdout == ""
    assert message in proc.stderr, proc.stderr


def test_make_images_passes_the_registry_push_and_dry_run_to_the_script() -> None:
    proc = subprocess.run(
        ["make", "-s", "images", "DRY_RUN=1", "REGISTRY=registry.example.com/team", "PUSH=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("docker push registry.example.com/team/starsd/") == 3
