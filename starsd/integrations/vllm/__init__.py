"""StarSD's draft as vLLM's speculative proposer (docs/vllm.md).

``--speculative-config '{"method": "custom_class", "model": "starsd.integrations.vllm.StarSDProposer",
"num_speculative_tokens": 4}'`` with ``STARSD_DRAFT=HOST:PORT`` in vLLM's environment. Nothing here imports
vLLM: the pure planning (:mod:`.rows`) and configuration (:mod:`.config`) are tested without it.
"""

from starsd.integrations.vllm.proposer import StarSDProposer

__all__ = ["StarSDProposer"]
