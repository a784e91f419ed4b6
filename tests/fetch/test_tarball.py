"""https:// tarballs against a loopback HTTPS server (ranges, ETags, If-Range), through ``starsd fetch-model``."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from starsd.fetch import checkpoint

from .conftest import MODELS, fetch_model, same_files
from .servers import TarballServer


def make_tarball(server: TarballServer, name: str, source: Path, *, top: str | None = "target") -> None:
    """``source``'s files in a gzipped tarball, under one directory ``top`` (or at the root)."""
    with tarfile.open(server.root / name, "w:gz", compresslevel=1) as tar:
        for path in sorted(source.iterdir()):
            tar.add(path, arcname=f"{top}/{path.name}" if top else path.name)


def env(server: TarballServer, token: str = "tar-token") -> dict[str, str]:
    return {"SSL_CERT_FILE": str(server.ca_file), "STARSD_HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.mark.parametrize("top", ["target", None])
def test_a_tarball_downloads_unpacked_and_verified(tarballs: TarballServer, tmp_path: Path, top: str | None) -> None:
    make_tarball(tarballs, f"t-{top}.tar.gz", MODELS / "target", top=top)
    dest = tmp_path / "m"
    run = fetch_model(tarballs.url(f"t-{top}.tar.gz"), dest, env(tarballs))
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "target", dest)
    assert not (checkpoint.state_dir(dest) / "download.part").exists()


def test_a_server_that_is_not_trusted_is_refused(tarballs: TarballServer, tmp_path: Path) -> None:
    make_tarball(tarballs, "trust.tar.gz", MODELS / "draft")
    run = fetch_model(tarballs.url("trust.tar.gz"), tmp_path / "m", {"STARSD_HTTP_AUTHORIZATION": "Bearer tar-token"})
    assert run.code == 1 and "SSLError" in run.termination_message


def test_a_wrong_credential_is_a_401_and_a_missing_file_a_404(tarballs: TarballServer, tmp_path: Path) -> None:
    make_tarball(tarballs, "auth.tar.gz", MODELS / "draft")
    wrong = fetch_model(tarballs.url("auth.tar.gz"), tmp_path / "a", env(tarballs, token="nope"))
    assert wrong.code == 1 and "401 Unauthorized" in wrong.termination_message
    missing = fetch_model(tarballs.url("gone.tar.gz"), tmp_path / "b", env(tarballs))
    assert missing.code == 1 and "404 Not Found" in missing.termination_message


def test_a_tarball_without_a_checkpoint_is_refused(tarballs: TarballServer, tmp_path: Path) -> None:
    with tarfile.open(tarballs.root / "notes.tar.gz", "w:gz") as tar:
        data = b"not a model"
        info = tarfile.TarInfo("notes/README.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    run = fetch_model(tarballs.url("notes.tar.gz"), tmp_path / "m", env(tarballs))
    assert run.code == 1 and "no config.json" in run.termination_message


def test_a_download_cut_off_is_resumed(tarballs: TarballServer, big_checkpoint: Path, tmp_path: Path) -> None:
    with tarfile.open(tarballs.root / "big.tar", "w") as tar:
        for path in sorted(big_checkpoint.iterdir()):
            tar.add(path, arcname=path.name)
    tarballs.faults.cut.add("/big.tar")
    dest = tmp_path / "m"
    run = fetch_model(tarballs.url("big.tar"), dest, env(tarballs))
    assert "/big.tar" not in tarballs.faults.cut, "the server never cut the download"
    assert run.code == 0, run.stderr
    assert same_files(big_checkpoint, dest)
    [resumed] = [s for s in tarballs.requests_for("/big.tar") if "range" in s.headers]
    start = int(resumed.headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start < (tarballs.root / "big.tar").stat().st_size and resumed.headers["if-range"]


def test_a_part_left_by_an_earlier_run_is_resumed(tarballs: TarballServer, tmp_path: Path) -> None:
    """What an init container killed half way leaves (the part and the server's validator) is kept."""
    make_tarball(tarballs, "again.tar.gz", MODELS / "target")
    whole = (tarballs.root / "again.tar.gz").read_bytes()
    first = fetch_model(tarballs.url("again.tar.gz"), tmp_path / "first", env(tarballs))
    assert first.code == 0, first.stderr
    dest = tmp_path / "m"
    state = checkpoint.state_dir(dest)
    state.mkdir(parents=True)
    (state / "download.part").write_bytes(whole[:1000])
    etag = _etag(tarballs, "again.tar.gz")
    (state / "download.validator").write_text(etag)
    run = fetch_model(tarballs.url("again.tar.gz"), dest, env(tarballs))
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "target", dest)
    assert tarballs.requests_for("/again.tar.gz")[-1].headers.get("range") == "bytes=1000-"


def _etag(server: TarballServer, name: str) -> str:
    import requests

    response = requests.head(server.url(name), headers={"Authorization": "Bearer tar-token"}, verify=server.ca_file)
    return str(response.headers["ETag"])
