"""The serving container of a pool with ``engine: vllm``: ``vllm serve`` with StarSD's proposer (docs/vllm.md).

The pod around it is a StarSD pool's (:mod:`.targets`): the same labels (so the draft's NetworkPolicy admits it
and the client Service routes to it), the same named port ``http``, model source, GPU resources, placement,
``/dev/shm``, emptyDir limits, security context and pod template merge. What differs is the process:

* ``vllm serve MODEL`` on the pool's ``image`` (a vLLM image with the starsd package installed), on the
  target port, under the name a StarSD target serves the same model by (the model directory's name), with
  ``--speculative-config`` naming StarSD's proposer and ``spec.target.gamma`` tokens per step, then the pool's
  ``vllm.args``;
* the proposer's environment: ``STARSD_DRAFT`` the drafts' headless Service (found live, as every StarSD
  target's ``--drafts-from``), ``STARSD_TARGET_ID`` the pod's name (each replica is its own target to the
  draft's rendezvous hashing and load accounting);
* probes on vLLM's ``/health``, and no preStop drain (vLLM has no ``/drain``: it gets the kubelet's SIGTERM).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from starsd import defaults

from . import constants as c
from . import naming
from .modelsource import ModelSource
from .naming import Owner
from .spec import ClusterSpec

HEALTH_PATH = "/health"  # vLLM's: 200 once the engine serves (the HTTP server only listens once the model loaded)


def speculative_config(gamma: int) -> str:
    """``--speculative-config``: StarSD's proposer, ``gamma`` tokens per step (vLLM's num_speculative_tokens)."""
    config = {"method": "custom_class", "model": defaults.VLLM_PROPOSER_CLASS, "num_speculative_tokens": gamma}
    return json.dumps(config, separators=(",", ":"))


def served_model_name(model: ModelSource) -> str:
    """What the pool answers to in ``model``: the model directory's name, as ``starsd target`` names it, so a
    client calls every pool of a cluster by one name."""
    return PurePosixPath(model.serve_path).name


def command(spec: ClusterSpec, model: ModelSource, args: tuple[str, ...]) -> list[str]:
    """``vllm serve`` as the operator runs it; the pool's own ``args`` come last."""
    return [
        "vllm",
        "serve",
        model.serve_path,
        "--port",
        str(c.TARGET_HTTP_PORT),
        "--served-model-name",
        served_model_name(model),
        "--speculative-config",
        speculative_config(spec.target.gamma),
        *args,
    ]


def env(owner: Owner) -> list[dict[str, Any]]:
    """The proposer's configuration (starsd/integrations/vllm/config.py), and vLLM's own in a pod that reaches
    nothing outside the cluster and may run as any user."""
    return [
        {"name": "STARSD_DRAFT", "value": naming.drafts_source(owner)},
        {"name": "STARSD_TARGET_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # torch's compile cache is named after getpass.getuser(), which fails for a uid without a passwd entry.
        {"name": "USER", "value": "starsd"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]
