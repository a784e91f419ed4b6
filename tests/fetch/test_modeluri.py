"""Model URIs: every scheme parsed, every malformed form refused with a reason; cache keys."""

from __future__ import annotations

import pytest

from starsd import modeluri
from starsd.modeluri import ModelURI, URIError


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("hf://Org/Name", ModelURI("hf://Org/Name", "hf", "Org/Name")),
        ("hf://org/name.v2@main", ModelURI("hf://org/name.v2@main", "hf", "org/name.v2", revision="main")),
        ("hf://o/n@refs/pr/1", ModelURI("hf://o/n@refs/pr/1", "hf", "o/n", revision="refs/pr/1")),
        ("s3://my-bucket/models/llama/", ModelURI("s3://my-bucket/models/llama/", "s3", "my-bucket", "models/llama")),
        ("s3://my.bucket", ModelURI("s3://my.bucket", "s3", "my.bucket", "")),
        ("gs://my_bucket/a/b", ModelURI("gs://my_bucket/a/b", "gs", "my_bucket", "a/b")),
        (
            "https://example.com:8443/m/model.tar.gz?sig=abc",
            ModelURI("https://example.com:8443/m/model.tar.gz?sig=abc", "https", "example.com:8443", "/m/model.tar.gz"),
        ),
        ("https://h/m.tgz", ModelURI("https://h/m.tgz", "https", "h", "/m.tgz")),
        ("https://h/m.tar", ModelURI("https://h/m.tar", "https", "h", "/m.tar")),
    ],
)
def test_every_scheme_parses(text: str, parsed: ModelURI) -> None:
    assert modeluri.parse(text) == parsed


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("models/draft", "not a URI"),
        ("ftp://host/m.tar.gz", "scheme 'ftp' is not supported"),
        ("http://host/m.tar.gz", "scheme 'http' is not supported"),
        ("oci://reg/img:tag", "scheme 'oci' is not supported"),
        ("hf://just-a-name", "hf://ORG/NAME"),
        ("hf://a/b/c", "hf://ORG/NAME"),
        ("hf://-a/b", "hf://ORG/NAME"),
        ("hf://a/b@", "revision"),
        ("hf://a/b@../x", "revision"),
        ("s3://Upper/x", "not a valid bucket name"),
        ("s3://ab/x", "not a valid bucket name"),
        ("s3://b_ucket/x", "not a valid bucket name"),
        ("s3://bucket/a/../b", "'..'"),
        ("gs:///x", "not a valid bucket name"),
        ("https://user:pw@host/m.tar.gz", "credentials do not belong in the URI"),
        ("https://host/model.zip", "tarball"),
        ("https:///m.tar.gz", "needs a host"),
        ("hf://a/b c", "no spaces"),
        ("s3://bucket/a\\b", "backslashes"),
        ("s3://bucket/" + "x" * 3000, "longer than"),
    ],
)
def test_malformed_uris_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(URIError) as caught:
        modeluri.parse(text)
    assert reason in str(caught.value)


def test_credentials_in_an_https_uri_are_not_repeated_in_the_error() -> None:
    with pytest.raises(URIError) as caught:
        modeluri.parse("https://user:s3cret@host/m.tar.gz")
    assert "s3cret" not in str(caught.value)


def test_cache_keys_are_directory_names_distinct_per_source_and_revision() -> None:
    texts = [
        "hf://org/name",
        "hf://org/name@main",
        "hf://org/name@v2",
        "hf://org/Name@v2",
        "s3://bucket/org/name",
        "gs://bucket/org/name",
        "https://h/org/name.tar.gz",
        "s3://bucket/" + "deep/" * 100 + "model",
    ]
    keys = [modeluri.cache_key(modeluri.parse(t)) for t in texts]
    assert len(set(keys)) == len(keys)
    for key in keys:
        assert key == key.lower() and "/" not in key and len(key) <= 100 and not key.startswith((".", "-"))
    assert modeluri.cache_key(modeluri.parse("hf://org/name@v2")).startswith("hf-org-name-v2-")
    assert modeluri.cache_key(modeluri.parse("hf://org/name")) == modeluri.cache_key(modeluri.parse("hf://org/name"))
