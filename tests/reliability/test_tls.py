"""TLS on the draft link: certificate and key from files (as a Kubernetes Secret mounts them).

A target given the CA drafts over TLS; a target without it cannot reach the draft and serves alone (fallback);
a client that trusts another CA, or speaks plaintext, is refused. Certificates are made here with ``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress
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


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, valid for two days, and its key (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


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
