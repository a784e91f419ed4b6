"""What a finished request reports of itself: OpenAI's ``usage``, and StarSD's ``starsd`` object (the star's
statistics summed over the choices, the target that served it, the token ids)."""

from __future__ import annotations

from typing import Any

from starsd.openai_api.responses import usage
from starsd.verifier.engine import GenerationStats


def usage_fields(prompts: list[list[int]], choices: list[GenerationStats], target_id: str) -> dict[str, Any]:
    """The ``usage`` and ``starsd`` fields of an answer whose choices generated ``choices``, in order."""
    generated = sum(s.generated_tokens for s in choices)
    totals = GenerationStats()
    for s in choices:
        for key, value in s.to_json().items():
            setattr(totals, key, getattr(totals, key) + value)
    extra: dict[str, Any] = {**totals.to_json(), "target": target_id}
    if len(choices) == 1:
        extra["token_ids"] = choices[0].token_ids
    else:
        extra["choices"] = [{"index": i, **s.to_json(), "token_ids": s.token_ids} for i, s in enumerate(choices)]
    return {"usage": usage(sum(len(p) for p in prompts), generated), "starsd": extra}
