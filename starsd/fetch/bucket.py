"""``s3://BUCKET/PREFIX`` and ``gs://BUCKET/PREFIX``: every object under a prefix, with boto3.

Credentials are boto3's own (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, an
instance or pod identity); with none at all the bucket is read anonymously. ``AWS_ENDPOINT_URL`` points at an
S3-compatible store (MinIO, Ceph, R2). Cloud Storage is read through its S3-compatible XML API
(``https://storage.googleapis.com``, or ``STARSD_GCS_ENDPOINT``) with an HMAC key in the same two variables:
one client library for both, and no second SDK in the image.

An object is downloaded into ``DEST/.starsd/parts/KEY`` and renamed into place when whole; a part left by an
interrupted run is resumed with a ranged GET pinned to the object's ETag (a changed object starts over).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from starsd.modeluri import ModelURI

from .checkpoint import state_dir
from .errors import FetchError

log = logging.getLogger(__name__)

GCS_ENDPOINT = "https://storage.googleapis.com"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Obj:
    key: str
    name: str  # path relative to the prefix: where it lands under DEST
    size: int
    etag: str


def fetch(uri: ModelURI, dest: Path, env: Mapping[str, str], make_room: Callable[[int], None]) -> dict[str, int]:
    """Download every object under ``uri`` into ``dest``; returns their relative names and sizes."""
    client = _client(uri, env)
    try:
        objects = _list(client, uri)
        parts = state_dir(dest) / "parts"
        make_room(sum(o.size for o in objects if not _done(dest / o.name, o.size)))
        for obj in objects:
            _download(client, uri, obj, dest / obj.name, parts / obj.name)
    except FetchError:
        raise
    except Exception as exc:
        raise FetchError(describe(uri, exc, credentials=_has_credentials(env))) from None
    return {o.name: o.size for o in objects}


def _has_credentials(env: Mapping[str, str]) -> bool:
    return bool(env.get("AWS_ACCESS_KEY_ID"))


def _client(uri: ModelURI, env: Mapping[str, str]) -> Any:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    options: dict[str, Any] = {"retries": {"mode": "standard", "max_attempts": 5}}
    if uri.scheme == "gs":
        options["s3"] = {"addressing_style": "path"}
    session = boto3.session.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ("auto" if uri.scheme == "gs" else None),
    )
    if session.get_credentials() is None:
        options["signature_version"] = UNSIGNED  # a public bucket
    endpoint: str | None
    if uri.scheme == "gs":
        endpoint = env.get("STARSD_GCS_ENDPOINT") or GCS_ENDPOINT
    else:
        endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3")
    return session.client("s3", endpoint_url=endpoint or None, config=Config(**options))


def _list(client: Any, uri: ModelURI) -> list[Obj]:
    prefix = f"{uri.path}/" if uri.path else ""
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.name, Prefix=prefix):
        for item in page.get("Contents") or []:
            key = item["Key"]
            if key.endswith("/"):
                continue  # a "folder" marker some tools create
            name = key[len(prefix) :]
            if any(part in ("", ".", "..") for part in PurePosixPath(name).parts) or name.startswith("/"):
                raise FetchError(f"{uri.text}: the object key {key!r} would land outside the model directory")
            objects.append(Obj(key=key, name=name, size=int(item["Size"]), etag=str(item.get("ETag") or "")))
    if not objects:
        raise FetchError(f"{uri.text}: 404 no objects under the prefix {prefix or '(the whole bucket)'!r}")
    return objects


def _done(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size


def _download(client: Any, uri: ModelURI, obj: Obj, final: Path, part: Path) -> None:
    if _done(final, obj.size):
        return
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if have > obj.size:
        have = 0
    request: dict[str, Any] = {"Bucket": uri.name, "Key": obj.key}
    if obj.etag:
        request["IfMatch"] = obj.etag
    if 0 < have < obj.size:
        request["Range"] = f"bytes={have}-"
        log.info("%s: resuming %s at byte %d of %d", uri.text, obj.name, have, obj.size)
    if have < obj.size:
        body = client.get_object(**request)["Body"]
        with part.open("ab" if have else "wb") as out:
            for chunk in body.iter_chunks(CHUNK):
                out.write(chunk)
    else:
        part.touch()
    got = part.stat().st_size
    if got != obj.size:
        raise FetchError(f"{uri.text}: {obj.key} ended at {got} of {obj.size} bytes (the download was cut off)")
    final.parent.mkdir(parents=True, exist_ok=True)
    part.replace(final)


def describe(uri: ModelURI, exc: BaseException, *, credentials: bool) -> str:
    """One sentence for a failed bucket download: the status and code the store sent, and what they mean."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        code = str(response["Error"].get("Code") or "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = str(response["Error"].get("Message") or "").strip()
        meaning = {
            "NoSuchBucket": f"the bucket {uri.name!r} does not exist",
            "NoSuchKey": "the object is gone",
            "InvalidAccessKeyId": "the access key in AWS_ACCESS_KEY_ID is not known to the store",
            "SignatureDoesNotMatch": "the secret in AWS_SECRET_ACCESS_KEY does not match the access key",
            "AccessDenied": "the credentials may not read this bucket"
            if credentials
            else "the bucket is not public: give credentials (credentials.secretRef)",
            "PreconditionFailed": "the object changed during the download; run again",
        }.get(code, message or code)
        return f"{uri.text}: {status} {code}: {meaning}"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return f"{uri.text}: no space left on device while downloading"
    return f"{uri.text}: {type(exc).__name__}: {first_line}"
