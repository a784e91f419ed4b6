"""Where the project's files live at run time."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def models_dir() -> Path:
    """The shipped ``draft/`` and ``target/`` checkpoints (``models/`` at the repository root).

    ``STARSD_MODELS_DIR`` overrides it (e.g. in a container image that copies the models elsewhere).
    """
    env = os.environ.get("STARSD_MODELS_DIR")
    return Path(env) if env else REPO_ROOT / "models"
