"""A target's drafts when a star has several: the ``--draft`` list, and which draft to use, try next, and go back to.

Pure logic, no I/O (the gRPC side is :class:`starsd.verifier.draft_client.DraftClient`). A target is given every
draft, in the operator's order (draft 0 first); :func:`starsd.assignment.ordered_drafts` turns that into this
target's own order, whose head is its first choice (docs/architecture.md, "Several drafts"). The policy:

* **Connect**: try the drafts in this target's order; the first that answers (and shares the vocabulary) is used.
* **Fail over**: when the draft in use is gone, retry it once (a reconnect), then try every other draft in order;
  the first that answers is used. With the client's backoff before the retry, the move takes one backoff.
* **Move back**: while on a draft that is not the first choice, probe the first choice every ``probe_seconds``;
  move back when it answers and :func:`has_room`.
* **Follow the drafts found live** (``--drafts-from``, :mod:`starsd.verifier.discovery`): :meth:`DraftPolicy.reorder`
  takes the new order. A new first choice is probed at once (and moved to as above); when the draft in use is
  no longer listed, the best listed draft that answers is moved to at once, while the old stream keeps serving
  until then. The order may be empty (no draft found yet): then there is nothing to try.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

ROOM_UTILIZATION = 0.9  # a draft busier than this (over its load window) has no room for a returning target
PROBE_SECONDS = 3.0  # how often a target away from its first choice asks whether it can move back


class DraftListError(ValueError):
    """A malformed ``--draft`` list."""


def parse_draft_addresses(text: str) -> list[str]:
    """The drafts of ``--draft``: one ``HOST:PORT`` or a comma-separated list of them (``unix:PATH`` too).

    An empty (or blank) value means no draft (the target decodes alone). Raises :class:`DraftListError` for an
    empty entry, an entry without a port, a port outside 1..65535, or an address given twice.
    """
    if not text.strip():
        return []
    addresses: list[str] = []
    for n, raw in enumerate(text.split(","), start=1):
        entry = raw.strip()
        where = f"--draft {text!r}: entry {n}"
        if not entry:
            raise DraftListError(f"{where} is empty; give HOST:PORT[,HOST:PORT...] with no empty entries")
        if any(c.isspace() for c in entry):
            raise DraftListError(f"{where} ({entry!r}) contains whitespace")
        if not entry.startswith("unix:"):
            host, sep, port = entry.rpartition(":")
            if not sep or not host or not port:
                raise DraftListError(f"{where} ({entry!r}) has no port; write HOST:PORT")
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise DraftListError(f"{where} ({entry!r}) has port {port!r}; a port is a number in 1..65535")
        if entry in addresses:
            raise DraftListError(f"{where} ({entry!r}) is listed twice; each draft appears once")
        addresses.append(entry)
    return addresses


class DraftLoad(Protocol):
    """What a draft's Info answer says of its load (:class:`starsd.proto.starsd_pb2.InfoResponse`)."""

    max_sessions: int
    utilization: float
    sessions: int

    def HasField(self, name: str) -> bool: ...


def has_room(info: DraftLoad, room_utilization: float = ROOM_UTILIZATION) -> bool:
    """Whether a draft can take one more target: it is below ``room_utilization`` busy and below its session
    limit. A draft too old to report its load (no ``utilization`` field) has room when it answers."""
    if not info.HasField("utilization"):
        return True
    if info.utilization >= room_utilization:
        return False
    return not (info.max_sessions and info.HasField("sessions") and info.sessions >= info.max_sessions)


class Reason(enum.StrEnum):
    """Why a target moved to another draft (the ``reason`` label of ``starsd_target_draft_switches_total``)."""

    DRAFT_LOST = "draft_lost"  # the draft in use broke its stream and did not answer a reconnect
    FIRST_CHOICE_BACK = "first_choice_back"  # the first choice answered a probe with room
    DRAFTS_CHANGED = "drafts_changed"  # the drafts found live changed: a new first choice, or this one left


@dataclass
class DraftPolicy:
    """One target's choice among its drafts. ``order`` is the target's own order (first choice first); ranks are
    indices into it. The caller reports what happened (:meth:`connected`, :meth:`lost`, :meth:`probed`) with the
    time; the policy answers what to try and when."""

    order: tuple[str, ...]
    probe_seconds: float = PROBE_SECONDS
    rank: int | None = None  # the draft in use; None while none is
    last: int | None = None  # the draft used last (in use, or lost)
    next_probe: float = 0.0
    displaced: str | None = None  # the draft in use (still connected) when it is no longer listed: move off it
    live: bool = False  # the order is found live (may start, and become, empty; see :meth:`reorder`)
    _probing: bool = field(default=False, repr=False)
    _reordered: bool = field(default=False, repr=False)  # the next move comes from a new order

    def __post_init__(self) -> None:
        if not self.order and not self.live:
            raise ValueError("a draft policy needs at least one draft")
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"a draft is listed twice in {list(self.order)}")
        if self.probe_seconds <= 0:
            raise ValueError(f"probe_seconds must be > 0, got {self.probe_seconds}")

    def attempts(self) -> list[int]:
        """The ranks to try, in order, to get a draft now: after losing one, that one first (a reconnect), then
        the others by rank; before any, all by rank."""
        others = [r for r in range(len(self.order)) if r != self.last]
        return others if self.last is None else [self.last, *others]

    def connected(self, rank: int, now: float) -> Reason | None:
        """Draft ``rank`` is in use from ``now``. Returns why this is a move to another draft, or None when it is
        the first draft this target used or the one it used last (a reconnect)."""
        if not 0 <= rank < len(self.order):
            raise ValueError(f"rank {rank} is not one of 0..{len(self.order) - 1}")
        previous, probing, displaced, reordered = self.last, self._probing, self.displaced, self._reordered
        self.rank = self.last = rank
        self._probing = self._reordered = False
        self.displaced = None
        self.next_probe = now + self.probe_seconds
        if displaced is not None:
            return Reason.DRAFTS_CHANGED
        if previous is None or previous == rank:
            return None
        if probing and rank == 0:
            return Reason.DRAFTS_CHANGED if reordered else Reason.FIRST_CHOICE_BACK
        return Reason.DRAFT_LOST

    def reorder(self, order: tuple[str, ...], now: float) -> None:
        """The drafts are now ``order`` (found live; may be empty). The draft in use keeps its place if listed;
        a new first choice is probed at once; a draft in use that left the list makes :attr:`displaced` true."""
        if len(set(order)) != len(order):
            raise ValueError(f"a draft is listed twice in {list(order)}")
        in_use = self.displaced if self.rank is None else self.order[self.rank]
        last = None if self.last is None else self.order[self.last]
        first = self.order[0] if self.order else None
        self.order = tuple(order)
        self.rank = self.order.index(in_use) if in_use in self.order else None
        self.last = self.order.index(last) if last in self.order else None
        if in_use is not None and self.rank is None:
            if self.displaced is None:
                self.next_probe = now  # move off it now
            self.displaced = in_use
        else:
            self.displaced = None
        if self.order and self.order[0] != first:
            self._reordered = True
            self.next_probe = now  # a new first choice: ask it now, not one interval later

    def lost(self) -> None:
        """The draft in use is gone (its stream ended)."""
        self.rank = None
        self.displaced = None

    def probe_delay(self, now: float) -> float | None:
        """Seconds until the first choice should be probed; None when there is nothing to probe (on the first
        choice, or on no draft: then :meth:`attempts` starts with the first choice anyway)."""
        if self.displaced is not None:
            return max(0.0, self.next_probe - now)
        if self.rank is None or self.rank == 0:
            return None
        return max(0.0, self.next_probe - now)

    def probed(self, now: float, answered: bool, room: bool) -> bool:
        """The first choice was probed at ``now``; True: move back to it (connect, then :meth:`connected` with
        rank 0). False: stay, and probe again ``probe_seconds`` later."""
        self.next_probe = now + self.probe_seconds
        self._probing = answered and room and self.rank not in (None, 0)
        return self._probing

    def escaped(self, now: float, found: bool) -> None:
        """A move off a displaced draft was tried at ``now``: ``found`` False keeps it in use and tries again
        ``probe_seconds`` later (the next move, when one is found, is :meth:`connected`)."""
        if not found:
            self.next_probe = now + self.probe_seconds

    def describe(self, rank: int | None) -> str:
        """``ADDRESS (rank R of D)`` for logs."""
        if rank is None:
            return f"{self.displaced} (no longer listed)" if self.displaced else "no draft"
        return f"{self.order[rank]} (rank {rank} of {len(self.order)})"
