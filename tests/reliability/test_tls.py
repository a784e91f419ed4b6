"""TLS on the draft link: certificate and key from files (as a Kubernetes Secret mounts them).

A target given the CA drafts over TLS; a target without it cannot reach the draft and serves alone (fallback);
a client that trusts another CA, or speaks plaintext, is refused. Certificates are made here with openssl.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from starsd.local import LocalStar, http_json
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc
from tests.integration.conftest import PROMPTS, Reference
from tests.reliability.conftest import START_TIMEOUT, Target, start_target

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}"]
    argv += ["-keyout", str(key), "-out", str(cert), "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return cert, key


@dataclass
class TlsStar:
    star: LocalStar  # the draft with TLS and one target trusting its certificate
    untrusting: Target  # a target given no CA: it speaks plaintext to a TLS port
    cert: Path
    other_cert: Path  # a certificate the draft does not use


@pytest.fixture(scope="module")
def tls_star(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsStar]:
    certs = tmp_path_factory.mktemp("certs")
    cert, key = self_signed(certs, "starsd-draft")
    other, _ = self_signed(certs, "somebody-else")
    log_dir = tmp_path_factory.mktemp("tls-star")
    star = LocalStar(
        draft_model=pair[0],
        target_model=pair[1],
        targets=1,
        log_dir=log_dir,
        draft_args=["--tls-cert", str(cert), "--tls-key", str(key)],
        target_args=["--draft-tls-ca", str(cert)],
    )
    star.start(timeout=START_TIMEOUT)  # waits until the trusting target reached the draft over TLS
    untrusting = None
    try:
        untrusting = start_target(pair[1], star.draft_address, "no-ca", log_dir, need_draft=False)
        yield TlsStar(star, untrusting, cert, other)
    finally:
        if untrusting is not None:
            untrusting.stop()
        star.stop()


def test_a_target_with_the_ca_drafts_over_tls(tls_star: TlsStar, oracle: Reference) -> None:
    url = tls_star.star.urls[0]
    for prompt in PROMPTS[:3]:
        status, body = http_json(f"{url}/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0})
        assert status == 200, body
        assert body["starsd"]["drafted_tokens"] > 0 and body["starsd"]["fallback_tokens"] == 0
        assert body["starsd"]["token_ids"] == oracle.greedy(prompt, 24)


def test_a_target_without_the_ca_cannot_use_the_draft_but_still_serves(tls_star: TlsStar, oracle: Reference) -> None:
    url = tls_star.untrusting.url
    status, ready = http_json(f"{url}/readyz")
    assert status == 200 and ready["draft_connected"] is False and ready["draft_error"]
    prompt = PROMPTS[3]
    status, body = http_json(f"{url}/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0})
    assert status == 200, body
    assert body["starsd"]["drafted_tokens"] == 0 and body["starsd"]["fallback_tokens"] > 0
    assert body["starsd"]["token_ids"] == oracle.greedy(prompt, 24)


def _info(channel: grpc.Channel) -> pb.InfoResponse:
    return pb_grpc.DraftStub(channel).Info(pb.InfoRequest(), timeout=10)


def test_the_draft_answers_only_clients_that_trust_its_certificate(tls_star: TlsStar) -> None:
    address = tls_star.star.draft_address
    trusted = grpc.ssl_channel_credentials(root_certificates=tls_star.cert.read_bytes())
    with grpc.secure_channel(address, trusted) as channel:
        assert _info(channel).vocab_size > 0
    wrong_ca = grpc.ssl_channel_credentials(root_certificates=tls_star.other_cert.read_bytes())
    with grpc.secure_channel(address, wrong_ca) as channel, pytest.raises(grpc.RpcError) as info:
        _info(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        _info(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
