"""s3:// (and gs://, through the same S3 API) against moto's S3 server, through the real ``starsd fetch-model``."""

from __future__ import annotations

from pathlib import Path

import pytest

from starsd import modeluri
from starsd.fetch import bucket, checkpoint

from .conftest import MODELS, S3, fetch_model, same_files

URI = "s3://models/pairs/shipped/draft"


def test_a_prefix_downloads_verified(s3: S3, tmp_path: Path) -> None:
    run = fetch_model(URI, tmp_path / "m", s3.env())
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "draft", tmp_path / "m")
    assert sorted(checkpoint.files_on_disk(tmp_path / "m")) == sorted(p.name for p in (MODELS / "draft").iterdir())


def test_gs_reads_through_the_s3_api_with_an_hmac_key(s3: S3, tmp_path: Path) -> None:
    env = s3.env(STARSD_GCS_ENDPOINT=s3.endpoint)
    del env["AWS_ENDPOINT_URL"]  # gs:// never reads the S3 endpoint
    run = fetch_model("gs://models/pairs/shipped/target", tmp_path / "m", env)
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "target", tmp_path / "m")


def test_a_wrong_access_key_names_the_variable(s3: S3, tmp_path: Path) -> None:
    run = fetch_model(URI, tmp_path / "m", s3.env(AWS_ACCESS_KEY_ID="AKIAWRONGWRONGWRONG1"))
    assert run.code == 1
    assert "403" in run.termination_message and "AWS_ACCESS_KEY_ID" in run.termination_message


def test_a_wrong_secret_names_the_variable(s3: S3, tmp_path: Path) -> None:
    run = fetch_model(URI, tmp_path / "m", s3.env(AWS_SECRET_ACCESS_KEY="wrong"))
    assert run.code == 1
    assert "403" in run.termination_message and "AWS_SECRET_ACCESS_KEY" in run.termination_message


@pytest.mark.parametrize(("credentials", "says"), [(False, "credentials.secretRef"), (True, "may not read")])
def test_access_denied_says_whether_credentials_are_missing_or_not_enough(credentials: bool, says: str) -> None:
    """(moto's server answers an unsigned request with a 500 once it checks credentials, so this one is
    the store's answer, as botocore raises it, without the server.)"""
    from botocore.exceptions import ClientError

    denied = ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}, "ResponseMetadata": {"HTTPStatusCode": 403}},
        "ListObjectsV2",
    )
    message = bucket.describe(modeluri.parse(URI), denied, credentials=credentials)
    assert message.startswith(f"{URI}: 403 AccessDenied") and says in message


def test_a_missing_prefix_and_a_missing_bucket_are_404s(s3: S3, tmp_path: Path) -> None:
    prefix = fetch_model("s3://models/pairs/nothing", tmp_path / "a", s3.env())
    assert prefix.code == 1 and "404" in prefix.termination_message and "pairs/nothing/" in prefix.termination_message
    bucket = fetch_model("s3://no-such-bucket/x", tmp_path / "b", s3.env())
    assert bucket.code == 1 and "404 NoSuchBucket" in bucket.termination_message


def test_a_part_left_by_an_interrupted_run_is_resumed_not_fetched_again(s3: S3, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    weights = (MODELS / "draft" / "model.safetensors").read_bytes()
    part = checkpoint.state_dir(dest) / "parts" / "model.safetensors"
    part.parent.mkdir(parents=True)
    # What a run killed half way through leaves; the marker byte shows whether the first half was kept.
    half = len(weights) // 2
    part.write_bytes(weights[:half])
    run = fetch_model(URI, dest, s3.env())
    assert run.code == 0, run.stderr
    assert (dest / "model.safetensors").read_bytes() == weights
    assert not part.exists()


def test_a_part_of_another_object_version_starts_over(s3: S3, tmp_path: Path) -> None:
    """The ranged GET is pinned to the listed ETag: a part that cannot be the object's prefix is not kept."""
    dest = tmp_path / "m"
    part = checkpoint.state_dir(dest) / "parts" / "model.safetensors"
    part.parent.mkdir(parents=True)
    size = (MODELS / "draft" / "model.safetensors").stat().st_size
    part.write_bytes(b"\0" * (size + 1))  # longer than the object: from an older, larger version
    run = fetch_model(URI, dest, s3.env())
    assert run.code == 0, run.stderr
    assert same_files(MODELS / "draft", dest)
