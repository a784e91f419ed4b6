"""Model URIs: where ``starsd fetch-model`` downloads a checkpoint from, parsed and checked.

One module for both sides: the operator refuses a malformed ``spec.*.model.uri`` with the field named, and
the downloader in the pod reads the same URI the same way. Standard library only (the operator's image has
no torch and no cloud SDKs).

Accepted forms (``SCHEMES``):

* ``hf://ORG/NAME`` or ``hf://ORG/NAME@REVISION``: a Hugging Face Hub model repository at a branch, tag or
  commit (the default branch when no revision is given);
* ``s3://BUCKET/PREFIX``: every object under ``PREFIX`` (S3, or any S3-compatible store via
  ``AWS_ENDPOINT_URL``);
* ``gs://BUCKET/PREFIX``: the same on Google Cloud Storage, through its S3-compatible XML API with HMAC keys;
* ``https://HOST/PATH/NAME.tar.gz`` (``.tgz``, ``.tar``): one tarball holding the checkpoint directory.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("hf", "s3", "gs", "https")
TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")
MAX_URI_LENGTH = 2048

# Hub repository ids: ORG/NAME, each part letters, digits, '-', '_', '.', not starting with '-' or '.'.
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
# S3 bucket names (3-63 lowercase letters, digits, '.', '-'); Cloud Storage also allows '_'.
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_KEY_CHARS = re.compile(r"^[^\x00-\x1f\x7f\\]*$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


class URIError(ValueError):
    """A model URI that cannot be downloaded; the message says what is wrong and what is accepted."""


@dataclass(frozen=True)
class ModelURI:
    """A parsed model URI.

    ``name`` is the Hub repository id (``ORG/NAME``), the bucket, or the HTTPS host; ``path`` the object
    prefix (no leading or trailing ``/``) or the URL's path; ``revision`` the Hub revision (``None``: the
    repository's default branch).
    """

    text: str
    scheme: str
    name: str
    path: str = ""
    revision: str | None = None

    @property
    def url(self) -> str:
        """The URL an HTTPS download requests (the URI as given)."""
        return self.text


def parse(text: str) -> ModelURI:
    """Parse ``text``; raises :class:`URIError` naming the problem."""
    if not isinstance(text, str) or not text:
        raise URIError("the model URI is empty")
    if len(text) > MAX_URI_LENGTH:
        raise URIError(f"the model URI is longer than {MAX_URI_LENGTH} characters")
    if any(ch.isspace() for ch in text) or not _KEY_CHARS.match(text):
        raise URIError(f"{text!r}: a model URI has no spaces, control characters or backslashes")
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise URIError(f"{text!r} is not a URI: expected {_forms()}")
    if scheme not in SCHEMES:
        raise URIError(f"{text!r}: the scheme {scheme!r} is not supported; use one of {_forms()}")
    if scheme == "hf":
        return _hf(text, rest)
    if scheme in ("s3", "gs"):
        return _bucket(text, scheme, rest)
    return _https(text)


def cache_key(uri: ModelURI) -> str:
    """A directory name for ``uri`` in a shared cache: readable, and unique per source and revision.

    The readable part is cut to fit; the hash of the canonical source keeps two long URIs apart.
    """
    canonical = f"{uri.scheme}://{uri.name}/{uri.path}@{uri.revision or ''}" if uri.scheme != "https" else uri.text
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    readable = "-".join(part for part in (uri.scheme, uri.name, uri.path, uri.revision or "") if part)
    readable = re.sub(r"[^a-z0-9.]+", "-", readable.lower()).strip("-.")[:80].rstrip("-.")
    return f"{readable}-{digest}"


def _forms() -> str:
    return "hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or https://HOST/PATH/MODEL.tar.gz"


def _hf(text: str, rest: str) -> ModelURI:
    repo, at, revision = rest.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_HF_PART.match(p) for p in parts) or any(".." in p for p in parts):
        raise URIError(f"{text!r}: a Hub URI is hf://ORG/NAME or hf://ORG/NAME@REVISION")
    if at and (not _HF_REVISION.match(revision) or ".." in revision or revision.startswith("/")):
        raise URIError(f"{text!r}: the revision after '@' must be a branch, tag or commit hash")
    return ModelURI(text=text, scheme="hf", name=repo, revision=revision if at else None)


def _bucket(text: str, scheme: str, rest: str) -> ModelURI:
    bucket, _, prefix = rest.partition("/")
    pattern = _S3_BUCKET if scheme == "s3" else _GS_BUCKET
    if not pattern.match(bucket) or ".." in bucket:
        raise URIError(f"{text!r}: {bucket!r} is not a valid bucket name ({scheme}://BUCKET/PREFIX)")
    prefix = prefix.strip("/")
    if any(part in (".", "..") for part in prefix.split("/") if prefix):
        raise URIError(f"{text!r}: the prefix may not contain '.' or '..' segments")
    return ModelURI(text=text, scheme=scheme, name=bucket, path=prefix)


def _https(text: str) -> ModelURI:
    parts = urlsplit(text)
    if parts.username is not None or parts.password is not None:
        raise URIError(
            f"{_redact(text)}: credentials do not belong in the URI (they would show in the pod spec); "
            "put them in a Secret named by credentials.secretRef"
        )
    if not parts.hostname or not _HOST.match(parts.netloc):
        raise URIError(f"{text!r}: an HTTPS URI needs a host")
    if not parts.path.endswith(TARBALL_SUFFIXES):
        raise URIError(
            f"{text!r}: an HTTPS source is one tarball of the checkpoint directory, "
            f"its path ending in {', '.join(TARBALL_SUFFIXES)}"
        )
    return ModelURI(text=text, scheme="https", name=parts.netloc, path=parts.path)


def _redact(text: str) -> str:
    parts = urlsplit(text)
    host = parts.hostname or ""
    return f"{parts.scheme}://***@{host}{parts.path}"
