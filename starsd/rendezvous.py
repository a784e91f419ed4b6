"""Rendezvous (highest-random-weight) hashing: which draft a target uses when it finds its drafts live.

Every target scores every draft with a stable hash of the pair (:func:`score`) and orders the drafts by score,
highest first (:func:`rank`): the head is its draft, the rest its failover order. No coordinator and no shared
list order are needed, and the scores of one pair never depend on the other drafts, so:

* **Adding a draft** moves exactly the targets whose highest score is the new draft's: about ``N/(D+1)``.
* **Removing a draft** moves exactly the targets that used it, each to its own next choice (spread evenly).
* **Balance** is statistical: each target's head is uniform over the drafts, so a draft carries about ``N/D``
  targets (``tests/test_rendezvous.py`` states the spread measured for D = 1..32 and N = 1..400).

A draft is scored by a *key* that outlives its address where the caller can give one (see
:mod:`starsd.verifier.discovery`, which keys a replaced pod's new address by the key of the one it replaced).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_SEPARATOR = b"\x00"


def score(target_id: str, key: str) -> int:
    """The weight of draft ``key`` for target ``target_id``: 64 bits of BLAKE2b over the pair (stable across
    processes, machines and Python versions, unlike :func:`hash`)."""
    digest = hashlib.blake2b(target_id.encode() + _SEPARATOR + key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(target_id: str, keys: Iterable[str]) -> list[str]:
    """``keys`` in the order ``target_id`` uses them: highest score first (ties, which need a 64-bit collision,
    broken by the key so the order is still total)."""
    unique = set(keys)
    return sorted(unique, key=lambda k: (-score(target_id, k), k))


def choice(target_id: str, keys: Iterable[str]) -> str | None:
    """The draft ``target_id`` uses among ``keys`` (None when there is none)."""
    best = None
    best_score = -1
    for key in keys:
        s = score(target_id, key)
        if s > best_score or (s == best_score and best is not None and key < best):
            best, best_score = key, s
    return best
