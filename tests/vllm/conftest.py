"""vLLM servers (the CPU build, in .venv-vllm/) beside StarSD drafts on loopback, for `make test-vllm`.

Every test here is skipped, with the reason, when .venv-vllm/ is absent: `make test-vllm` creates it (apart
from the project's .venv/, from bench/vllm.lock) and runs these tests.
"""

from __future__ import annotations

import functools
import os

from starsd.bench import vllm_fleet
from starsd.bench.vllm_fleet import DEFAULT_VENV as VENV
from starsd.bench.vllm_fleet import VllmServer, starsd_speculation

__all__ = ["NO_VLLM", "START_SECONDS", "VENV", "VllmServer", "running", "speculative_config"]

VLLM = VENV / "bin" / "vllm"
START_SECONDS = float(os.environ.get("STARSD_VLLM_START_SECONDS", "900"))  # 2-3 minutes alone on two cores

NO_VLLM = (
    None
    if VLLM.is_file()
    else f"vLLM is not installed in {VENV}: `make test-vllm` installs it (bench/vllm.lock) and runs these tests"
)

running = functools.partial(vllm_fleet.running, start_seconds=START_SECONDS)
speculative_config = starsd_speculation
