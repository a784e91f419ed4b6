"""Servers for the downloader's tests, and ``starsd fetch-model`` run as the init container runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from starsd.local import free_port

from .servers import HubMirror, TarballServer

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
HUB_TOKEN = "hf_right"


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    termination_message: str  # what the command said last (stderr's last line)


def fetch_model(uri: str, dest: Path, env: dict[str, str]) -> Run:
    """``starsd fetch-model URI DEST`` in a fresh process, with only ``env`` (plus PATH and HOME)."""
    base = {"PATH": os.environ["PATH"], "HOME": str(dest.parent), "HF_HOME": str(dest.parent / ".hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "starsd.cli", "--log-level", "WARNING", "fetch-model", uri, str(dest)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return Run(proc.returncode, proc.stdout, proc.stderr, last)


def same_files(a: Path, b: Path) -> bool:
    """``b`` holds every file of ``a`` byte for byte."""
    return all((b / p.name).read_bytes() == p.read_bytes() for p in a.iterdir() if p.is_file())


# huggingface_hub writes a download to disk in 10 MiB chunks: a resumable cut needs a file larger than that.
BIG_SHARD_BYTES = 24 << 20


@pytest.fixture(scope="session")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped target plus a 24 MiB shard."""
    root = tmp_path_factory.mktemp("big")
    for path in (MODELS / "target").iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    (root / "extra.safetensors").write_bytes(bytes(range(256)) * (BIG_SHARD_BYTES // 256))
    return root


@pytest.fixture(scope="session")
def hub(big_checkpoint: Path) -> Iterator[HubMirror]:
    repos = {
        "starsd/draft": MODELS / "draft",
        "starsd/target": MODELS / "target",
        "starsd/big": big_checkpoint,
        "starsd/no-tokenizer": MODELS,
    }
    server = HubMirror(repos, token=HUB_TOKEN).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tarballs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TarballServer]:
    root = tmp_path_factory.mktemp("tarballs")
    server = TarballServer(root, tmp_path_factory.mktemp("cert"), token="tar-token").start()
    yield server
    server.stop()


@dataclass(frozen=True)
class S3:
    endpoint: str
    key_id: str
    secret: str

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": "us-east-1",
            **extra,
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """moto's S3 server in its own process, checking credentials against its IAM (after the 3 set-up calls)."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.2)
        iam = boto3.client(
            "iam", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1"
        )
        iam.create_user(UserName="reader")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        store = S3(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
        client = store.client()
        client.create_bucket(Bucket="models")
        for name in ("draft", "target"):
            for path in sorted((MODELS / name).iterdir()):
                client.upload_file(str(path), "models", f"pairs/shipped/{name}/{path.name}")
        yield store
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
