"""The targets' API key (``spec.auth.apiKeySecretRef``): how it reaches the pods, and what the operator
reports about its Secret.

The key reaches each target container as ``$STARSD_API_KEY`` from the Secret (``valueFrom.secretKeyRef``,
never optional): it is never in the command, never a literal in the pod spec, and a pod whose Secret or key is
missing does not start (``CreateContainerConfigError``) rather than start open. The value may hold several keys,
comma- or newline-separated (starsd.openai_api.auth), which is how a key is rotated without refusing anyone.

Rotation: a change of the key's value rolls the pools through the partitioned rollout (.rollout), because the
pod template carries a digest of it (:data:`ANNOTATION_DIGEST`): a salted, truncated SHA-256 that changes with
the value, says nothing usable about a random key, and changes nothing when only the Secret's metadata does.
The operator reads the Secret each reconcile and each tick (``get`` on Secrets), so a changed key rolls within
one tick, and a missing Secret or key is reported in the ``AuthReady`` condition.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starsd import defaults

from . import constants as c
from .conditions import Condition
from .kube import Kube, KubeError
from .naming import Owner
from .spec import AuthSpec, SecretKeyRef

ANNOTATION_DIGEST = f"{c.GROUP}/api-key-digest"

# The Secret's state (the AuthReady condition's reason when it is not usable).
NOT_CONFIGURED = "NotConfigured"
FOUND = "SecretFound"
SECRET_NOT_FOUND = "SecretNotFound"
KEY_NOT_FOUND = "SecretKeyNotFound"
KEY_EMPTY = "SecretKeyEmpty"
UNREADABLE = "SecretUnreadable"  # the operator may not read it (RBAC): the pods still take the key


@dataclass(frozen=True)
class KeyState:
    """What the operator found of the key: ``reason`` (one of the states above) and, when found, the value's
    digest for the pod template."""

    reason: str
    ref: SecretKeyRef | None = None
    digest: str | None = None

    @property
    def usable(self) -> bool:
        return self.reason in (NOT_CONFIGURED, FOUND)

    @property
    def unknown(self) -> bool:
        return self.reason == UNREADABLE


def env(auth: AuthSpec, name: str = defaults.API_KEY_ENV) -> list[dict[str, Any]]:
    """The target container's ``$STARSD_API_KEY`` (a vLLM pool's: ``name`` ``VLLM_API_KEY``) from the Secret
    (none without ``spec.auth``)."""
    ref = auth.api_key_secret
    if ref is None:
        return []
    return [
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key, "optional": False}},
        }
    ]


def template_annotations(state: KeyState | None) -> dict[str, str]:
    """The pod template's annotation that rolls the pools when the key changes (none without a key)."""
    if state is None or state.digest is None:
        return {}
    return {ANNOTATION_DIGEST: state.digest}


def inspect(auth: AuthSpec, secret: Mapping[str, Any] | None) -> KeyState:
    """The state of the key given the Secret as the API server returned it (None: it does not exist)."""
    ref = auth.api_key_secret
    if ref is None:
        return KeyState(NOT_CONFIGURED)
    if secret is None:
        return KeyState(SECRET_NOT_FOUND, ref)
    data = secret.get("data") or {}
    if ref.key not in data:
        return KeyState(KEY_NOT_FOUND, ref)
    try:
        value = base64.b64decode(str(data[ref.key] or ""), validate=True)
    except ValueError:
        value = b""
    if not value.strip(b" \t\r\n,"):
        return KeyState(KEY_EMPTY, ref)
    salt = str((secret.get("metadata") or {}).get("uid") or "").encode()
    digest = hashlib.sha256(salt + b"\0" + value).hexdigest()[:16]
    return KeyState(FOUND, ref, digest)


def observe(kube: Kube, owner: Owner, auth: AuthSpec) -> KeyState:
    """Read the Secret ``spec.auth`` names (nothing without one). Raises :class:`KubeError` when it cannot be
    read for another reason than its absence or a refusal (403: the operator's role lacks ``get`` on Secrets), so
    the reconcile retries rather than roll the pools."""
    ref = auth.api_key_secret
    if ref is None:
        return KeyState(NOT_CONFIGURED)
    try:
        secret = kube.get("Secret", owner.namespace, ref.name)
    except KubeError as exc:
        if exc.status != 403:
            raise
        return KeyState(UNREADABLE, ref)
    return inspect(auth, secret)


def condition(state: KeyState | None, namespace: str) -> Condition:
    """``AuthReady``: whether the targets' key is there for their pods to start with."""
    if state is None:
        return Condition(c.COND_AUTH_READY, False, "Unknown", "the API key's Secret was not read", unknown=True)
    ref = state.ref
    where = f"Secret {ref.name} in namespace {namespace}" if ref else ""
    messages = {
        NOT_CONFIGURED: "spec.auth is not set: the targets serve every caller that reaches them, without a key",
        FOUND: f"the targets take the API keys of key {ref.key if ref else ''} of {where}",
        SECRET_NOT_FOUND: f"spec.auth.apiKeySecretRef names {where}, which does not exist: target pods cannot "
        "start until it does",
        KEY_NOT_FOUND: f"{where} has no key {ref.key if ref else ''} (spec.auth.apiKeySecretRef.key): target pods "
        "cannot start until it does",
        KEY_EMPTY: f"key {ref.key if ref else ''} of {where} holds no API key: the targets refuse to start "
        "with an empty one",
        UNREADABLE: f"the operator may not read {where} (its role needs get on secrets): the pods still take "
        "the key from it, but whether it exists is unknown, and a changed key does not roll them",
    }
    return Condition(c.COND_AUTH_READY, state.usable, state.reason, messages[state.reason], unknown=state.unknown)
