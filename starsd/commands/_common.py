"""Small helpers shared by the server commands."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

TERMINATION_LOG = Path("/dev/termination-log")

log = logging.getLogger("starsd")


def fail(message: str, code: int = 2) -> int:
    """Report a fatal start-up error on stderr and, inside Kubernetes, in the termination log.

    Kubernetes shows the termination log as the container's last state, and the operator surfaces it in the
    StarSDCluster's status, so a wrong model path reads as a clear reason rather than a crash loop.
    """
    print(f"starsd: error: {message}", file=sys.stderr)
    try:
        if TERMINATION_LOG.exists():
            TERMINATION_LOG.write_text(message[:4000])
    except OSError:
        pass
    return code


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"{text} is not > 0")
    return value
