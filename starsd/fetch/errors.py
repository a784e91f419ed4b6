"""The one error a download reports: a sentence for the pod's termination message and the cluster status."""

from __future__ import annotations


class FetchError(Exception):
    """A download that cannot finish; the message names the source and the cause (401, 404, no space, ...)."""
