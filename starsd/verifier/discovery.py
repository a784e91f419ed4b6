"""Finding the star's drafts live: ``--drafts-from dns:HOST:PORT`` (docs/architecture.md, "Several drafts").

In Kubernetes ``HOST`` is the drafts' headless Service (``NAME-draft-pods.NAMESPACE.svc``), whose DNS answer lists
the ready draft pods' addresses. A target resolves it every few seconds (:class:`DraftDiscovery`) and orders
the addresses by rendezvous hashing of its own id (:mod:`starsd.rendezvous`); the draft client follows the order.

A draft is scored by a *slot*, not by its address (:func:`assign_slots`): an address keeps its slot while it is
listed, a new address takes the lowest slot no listed address holds, and only then a new one. So a draft pod
that is replaced (a new pod, a new IP) takes its predecessor's slot and only that pod's targets move; a new
draft takes a new slot and only the targets it wins move. Each target keeps its own slots (targets that started
at different times may number the drafts differently): balance rests on each target's scores alone, so it
holds all the same.

Resolution never takes a target down: a lookup that fails (no such name, an empty answer, a resolver that does
not answer within ``timeout``) keeps the drafts last found, is logged once per distinct error, and is shown in
``/readyz`` (:attr:`DraftDiscovery.error`). The resolver is a plain function, so tests inject their own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from starsd import rendezvous

log = logging.getLogger(__name__)

SCHEME = "dns:"
RESOLVE_SECONDS = 5.0  # how often the drafts are looked up again (the cluster DNS's own TTL for a headless Service)
RESOLVE_TIMEOUT = 2.0  # a lookup that takes longer counts as failed; the drafts last found are kept

Resolver = Callable[[str, int], Sequence[str]]  # (host, port) -> IP addresses; raises OSError when it cannot


class DraftSourceError(ValueError):
    """A malformed ``--drafts-from`` value."""


@dataclass(frozen=True)
class DnsSource:
    """A DNS name whose addresses are the drafts, and the drafts' gRPC port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{SCHEME}{self.host}:{self.port}"


def parse_drafts_from(text: str) -> DnsSource:
    """``dns:HOST:PORT`` (gRPC's ``dns:///HOST:PORT`` too; the only scheme); raises :class:`DraftSourceError`
    naming what is wrong."""
    value = text.strip()
    where = f"--drafts-from {text!r}"
    if not value.startswith(SCHEME):
        raise DraftSourceError(f"{where}: write dns:HOST:PORT (e.g. dns:chat-draft-pods.ml.svc:50051)")
    host, sep, port = value.removeprefix(SCHEME).removeprefix("///").rpartition(":")
    if not sep or not host or not port:
        raise DraftSourceError(f"{where} has no port; write dns:HOST:PORT")
    if any(ch.isspace() for ch in host) or "," in host:
        raise DraftSourceError(f"{where}: the host {host!r} is not one DNS name")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise DraftSourceError(f"{where} has port {port!r}; a port is a number in 1..65535")
    return DnsSource(host.strip("[]"), int(port))


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (every A and AAAA record), through the system's resolver."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def endpoint(ip: str, port: int) -> str:
    """``IP:PORT`` as gRPC dials it (an IPv6 address in brackets)."""
    try:
        v6 = ipaddress.ip_address(ip).version == 6
    except ValueError:
        v6 = False
    return f"[{ip}]:{port}" if v6 else f"{ip}:{port}"


def slot_key(slot: int) -> str:
    """What rendezvous hashing scores a draft in ``slot`` by."""
    return f"draft-{slot}"


def assign_slots(previous: Mapping[str, int], endpoints: Iterable[str]) -> dict[str, int]:
    """Each of ``endpoints`` with its slot: the one it had in ``previous``, else the lowest slot free (listed
    endpoints in sorted order take them), else a new one."""
    live = sorted(set(endpoints))
    slots = {e: previous[e] for e in live if e in previous}
    taken = set(slots.values())
    free = (i for i in itertools.count() if i not in taken)
    for e in live:
        if e not in slots:
            slots[e] = next(free)
    return slots


def order_for(target_id: str, slots: Mapping[str, int]) -> tuple[str, ...]:
    """The endpoints of ``slots`` in the order ``target_id`` uses them (rendezvous over their slot keys)."""
    by_key = {slot_key(s): e for e, s in slots.items()}
    return tuple(by_key[k] for k in rendezvous.rank(target_id, by_key))


class DraftDiscovery:
    """The drafts behind one DNS name, in one target's order, kept up to date by :meth:`run`."""

    def __init__(
        self,
        source: DnsSource,
        target_id: str,
        resolver: Resolver = system_resolver,
        interval: float = RESOLVE_SECONDS,
        timeout: float = RESOLVE_TIMEOUT,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"interval and timeout must be > 0, got {interval} and {timeout}")
        self.source = source
        self.target_id = target_id
        self.resolver = resolver
        self.interval = interval
        self.timeout = timeout
        self.slots: dict[str, int] = {}
        self.order: tuple[str, ...] = ()  # the drafts last found, this target's first choice first
        self.error = ""  # why the last lookup failed ("" when it succeeded)
        self.resolved_at: float | None = None  # time.time() of the last successful lookup
        self._lookup: asyncio.Future[Sequence[str]] | None = None  # a lookup still running in its thread

    async def refresh(self) -> bool:
        """Look the drafts up once; True when this target's order changed. Never raises for a failed lookup:
        it keeps the drafts last found and says why in :attr:`error` (and the log, once per distinct error)."""
        try:
            ips = await self._resolve()
        except Exception as exc:  # whatever a resolver raises, the target keeps serving
            self._failed(_describe(exc, self.timeout))
            return False
        if not ips:
            self._failed("the DNS answer lists no draft (no draft pod is ready)")
            return False
        if self.error:
            log.info("the drafts at %s resolve again", self.source)
        self.error = ""
        self.resolved_at = time.time()
        self.slots = assign_slots(self.slots, (endpoint(ip, self.source.port) for ip in ips))
        order = order_for(self.target_id, self.slots)
        if order == self.order:
            return False
        log.info("drafts at %s: %s (this target's order)", self.source, ", ".join(order))
        self.order = order
        return True

    async def run(self, on_change: Callable[[tuple[str, ...]], None]) -> None:
        """Look the drafts up every :attr:`interval` seconds; call ``on_change`` with each new order."""
        while True:
            await asyncio.sleep(self.interval)
            if await self.refresh():
                on_change(self.order)

    async def _resolve(self) -> Sequence[str]:
        if self._lookup is not None and not self._lookup.done():
            raise TimeoutError("the previous lookup has not returned yet")
        loop = asyncio.get_running_loop()
        # The lookup runs in a thread (getaddrinfo blocks); one that hangs is left there, and no other starts
        # beside it, so a dead resolver costs one thread, not one per interval.
        self._lookup = loop.run_in_executor(None, self.resolver, self.source.host, self.source.port)
        self._lookup.add_done_callback(_retrieve)  # an abandoned lookup's error is not "never retrieved"
        async with asyncio.timeout(self.timeout):
            return await asyncio.shield(self._lookup)

    def _failed(self, why: str) -> None:
        if why != self.error:
            kept = f"keeping the {len(self.order)} drafts last found" if self.order else "decoding alone"
            log.warning("cannot find the drafts at %s: %s; %s", self.source, why, kept)
        self.error = why


def _retrieve(future: asyncio.Future[Sequence[str]]) -> None:
    if not future.cancelled():
        future.exception()


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return str(exc) or f"the resolver did not answer within {timeout:g} s"
    if isinstance(exc, socket.gaierror):
        return f"the name does not resolve ({exc.strerror or exc})"
    return f"{type(exc).__name__}: {exc}"
