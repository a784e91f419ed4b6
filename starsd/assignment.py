"""Which draft serves which target when a star has several drafts: an ordered list of drafts per target.

A target knows its ordinal (the ``-N`` that ends a StatefulSet pod's name, see :func:`target_ordinal`) and the
list of drafts; from these two alone it computes where to connect, so the operator renders one pod template for
a whole pool and no coordinator is needed. The assignment has three properties (``tests/test_assignment.py``):

* **Balanced.** Over ordinals ``0..N-1``, every one of ``D`` drafts is the first choice of about ``N/D``
  targets, for every ``N`` (StatefulSet ordinals are contiguous, so any pool size is a prefix): the most and
  the least loaded draft differ by at most one target up to 4 drafts, by at most 5 up to 32.
* **Stable.** Going from ``D`` to ``D+1`` drafts, only the targets that the new draft takes change their first
  choice: about ``N/(D+1)`` of them, the fewest possible; going back from ``D+1`` to ``D`` restores the old
  assignment exactly (a StatefulSet scales down by removing its highest ordinal, the newest draft).
* **Spread on failure.** The targets of one draft list the other drafts in rotation, so when a draft is gone its
  targets move to all the others evenly, not all to the same one.

How: with one draft every target uses it. Adding draft ``D`` walks the ordinals in order and hands ordinal
``i`` to the new draft when the new draft holds fewer targets (so far) than ``i``'s current draft does; so the
new draft takes from each old draft in turn until it holds its share.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Sequence

HASHED_ORDINALS = 4096  # an id without a trailing number gets an ordinal below this, from a hash of the id
_TRAILING_NUMBER = re.compile(r"(\d+)$")


def target_ordinal(target_id: str) -> int:
    """The ordinal of a target: the number that ends its id (``web-pool-a-3`` -> 3, ``t12`` -> 12), or, for an
    id without one, a stable hash of the id below :data:`HASHED_ORDINALS`."""
    match = _TRAILING_NUMBER.search(target_id)
    if match:
        return int(match.group(1))
    return zlib.crc32(target_id.encode()) % HASHED_ORDINALS


@functools.lru_cache(maxsize=256)
def first_choices(targets: int, drafts: int) -> tuple[int, ...]:
    """The first-choice draft (``0..drafts-1``) of each of the ordinals ``0..targets-1``."""
    if targets < 0:
        raise ValueError(f"targets must be >= 0, got {targets}")
    if drafts < 1:
        raise ValueError(f"drafts must be >= 1, got {drafts}")
    if drafts == 1:
        return (0,) * targets
    old = first_choices(targets, drafts - 1)
    new = drafts - 1
    held = [0] * drafts  # targets each draft holds among the ordinals walked so far
    out = []
    for current in old:
        chosen = new if held[new] < held[current] else current
        held[chosen] += 1
        out.append(chosen)
    return tuple(out)


def preference(ordinal: int, drafts: int) -> list[int]:
    """Every draft index, in the order the target with ``ordinal`` tries them: its first choice, then the others
    in a rotation that starts at a different draft for each of the first choice's targets."""
    if ordinal < 0:
        raise ValueError(f"an ordinal is >= 0, got {ordinal}")
    choices = first_choices(ordinal + 1, drafts)
    first = choices[ordinal]
    rank = choices[:ordinal].count(first)  # this target is the rank-th of its first choice's targets
    others = [d for d in range(drafts) if d != first]
    if not others:
        return [first]
    start = rank % len(others)
    return [first, *others[start:], *others[:start]]


def ordered_drafts(target_id: str, drafts: Sequence[str]) -> list[str]:
    """The drafts (addresses, in the operator's order: draft 0 first) in the order ``target_id`` tries them."""
    if not drafts:
        return []
    return [drafts[i] for i in preference(target_ordinal(target_id), len(drafts))]
