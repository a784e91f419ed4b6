"""hf:// against a loopback mirror of the Hub's routes (HF_ENDPOINT), through the real ``starsd fetch-model``."""

from __future__ import annotations

from pathlib import Path

from starsd.fetch import checkpoint

from .conftest import HUB_TOKEN, MODELS, fetch_model, same_files
from .servers import HubMirror


def env(hub: HubMirror, token: str = HUB_TOKEN) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": token}


def test_a_repository_downloads_verified_and_a_second_run_downloads_nothing(hub: HubMirror, tmp_path: Path) -> None:
    dest = tmp_path / "model"
    run = fetch_model("hf://starsd/draft", dest, env(hub))
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "draft", dest)
    assert checkpoint.complete(dest, "hf://starsd/draft") is not None

    before = len(hub.requests_for("/model.safetensors"))
    again = fetch_model("hf://starsd/draft", dest, env(hub))
    assert again.code == 0 and "already present" in again.stdout
    assert len(hub.requests_for("/model.safetensors")) == before


def test_a_pinned_revision_downloads_that_commit(hub: HubMirror, tmp_path: Path) -> None:
    commit = hub.commits["starsd/target"]
    run = fetch_model(f"hf://starsd/target@{commit}", tmp_path / "m", env(hub))
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "target", tmp_path / "m")
    assert hub.requests_for(f"/starsd/target/resolve/{commit}/config.json")


def test_a_wrong_token_is_a_401_that_names_the_token(hub: HubMirror, tmp_path: Path) -> None:
    run = fetch_model("hf://starsd/draft", tmp_path / "m", env(hub, token="hf_wrong"))
    assert run.code == 1
    assert "401" in run.termination_message and "HF_TOKEN" in run.termination_message
    assert not (tmp_path / "m" / "config.json").exists()


def test_a_missing_repository_and_a_missing_revision_are_404s(hub: HubMirror, tmp_path: Path) -> None:
    repo = fetch_model("hf://starsd/nothing-here", tmp_path / "a", env(hub))
    assert repo.code == 1 and "404" in repo.termination_message and "starsd/nothing-here" in repo.termination_message
    rev = fetch_model("hf://starsd/draft@v9", tmp_path / "b", env(hub))
    assert rev.code == 1 and "404" in rev.termination_message and "'v9'" in rev.termination_message


def test_a_repository_that_is_no_checkpoint_is_refused(hub: HubMirror, tmp_path: Path) -> None:
    run = fetch_model("hf://starsd/no-tokenizer", tmp_path / "m", env(hub))
    assert run.code == 1 and "config.json" in run.termination_message
    assert checkpoint.complete(tmp_path / "m", "hf://starsd/no-tokenizer") is None


def test_an_interrupted_download_resumes_from_where_it_stopped(
    hub: HubMirror, big_checkpoint: Path, tmp_path: Path
) -> None:
    path = "/starsd/big/resolve/" + hub.commits["starsd/big"] + "/extra.safetensors"
    hub.faults.cut.add(path)
    run = fetch_model("hf://starsd/big", tmp_path / "m", env(hub))
    assert path not in hub.faults.cut, "the mirror never cut the download"
    assert run.code == 0, run.stderr
    assert same_files(big_checkpoint, tmp_path / "m")
    ranged = [s for s in hub.requests_for(path) if "range" in s.headers]
    size = (big_checkpoint / "extra.safetensors").stat().st_size
    assert ranged, "the second request did not resume"
    start = int(ranged[-1].headers["range"].removeprefix("bytes=").split("-")[0])
    assert 0 < start < size
