"""What the API server does with a structural schema, in miniature: strict validation and defaulting.

``to_jsonschema`` keeps every OpenAPI constraint jsonschema understands and, like ``kubectl apply``'s strict
field validation, refuses unknown fields. CEL rules (``x-kubernetes-validations``) are not evaluated here:
the e2e suite runs them on a real API server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any


def to_jsonschema(schema: dict[str, Any], *, strict: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("format", "description"):
            continue
        if key == "properties":
            out[key] = {k: to_jsonschema(v, strict=strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_jsonschema(value, strict=strict)
        elif key == "anyOf":
            out[key] = [to_jsonschema(v, strict=strict) for v in value]
        else:
            out[key] = copy.deepcopy(value)
    if strict and schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """``obj`` with the schema's defaults filled in, top-down, as the API server defaults a request."""
    if isinstance(obj, dict) and schema.get("type") == "object":
        out = dict(obj)
        for name, sub in (schema.get("properties") or {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(sub, out[name])
        return out
    if isinstance(obj, list) and schema.get("type") == "array":
        return [apply_defaults(schema.get("items") or {}, item) for item in obj]
    return obj


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, node) of a schema, depth first."""
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")
