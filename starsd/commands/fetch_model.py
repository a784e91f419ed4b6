"""``starsd fetch-model URI DEST``: what a pod's init container runs before the draft or target starts.

Downloads the checkpoint at URI into DEST (resuming what an earlier, interrupted run left), checks it (the
source's file list and sizes, ``config.json``, a tokenizer) and exits 0; or exits 1 with one sentence on
stderr and in ``/dev/termination-log`` (the 401, the 404, the missing space), which the operator shows in the
StarSDCluster's ``Ready`` condition. Run again on a complete DEST it returns at once.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from starsd.commands._common import fail

SOURCES = (
    "hf://ORG/NAME[@REVISION]: a Hugging Face Hub repository (HF_TOKEN; HF_ENDPOINT for a mirror). "
    "s3://BUCKET/PREFIX: every object under PREFIX (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, "
    "AWS_REGION; AWS_ENDPOINT_URL for an S3-compatible store; anonymous without credentials). "
    "gs://BUCKET/PREFIX: Cloud Storage through its S3-compatible API, an HMAC key in AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY (STARSD_GCS_ENDPOINT overrides the host). "
    "https://HOST/PATH/MODEL.tar.gz (.tgz, .tar): one tarball of the checkpoint directory; "
    "STARSD_HTTP_AUTHORIZATION is sent as the Authorization header."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Download a model checkpoint into DEST and verify it: every file the source lists at its size, "
        "config.json and a tokenizer. An interrupted download resumes; a DEST that already holds the same "
        "source is left as it is."
    )
    parser.add_argument("uri", metavar="URI", help=f"where the model is. {SOURCES}")
    parser.add_argument("dest", metavar="DEST", type=Path, help="directory to download into (created if missing)")


def run(args: argparse.Namespace) -> int:
    from starsd.fetch import FetchError, fetch_model

    try:
        result = fetch_model(args.uri, args.dest, os.environ)
    except FetchError as exc:
        return fail(str(exc), code=1)
    verb = "already present" if result.cached else "downloaded and verified"
    print(f"{args.uri}: {verb} in {result.dest} ({len(result.files)} files, {result.total_bytes} bytes)")
    return 0
