"""The proposer's link to the draft: a :class:`~starsd.verifier.draft_client.DraftClient` on its own event loop.

vLLM calls the proposer synchronously from its model runner; the client is asyncio. The client runs on a
daemon thread's loop (its reconnect loop keeps running between steps), and :meth:`StepLink.burst` hands it a
step's requests and waits for their answers, never longer than the step's deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from starsd.integrations.vllm.config import ProposerConfig
from starsd.proto import starsd_pb2 as pb
from starsd.verifier.discovery import DraftDiscovery
from starsd.verifier.draft_client import DraftClient, DraftClientOptions, VocabularyMismatch, check_draft_info

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds a step may wait beyond the burst's own deadline for the loop thread to hand the answers over.
_HANDOVER_SECONDS = 0.05


@dataclass(frozen=True)
class Burst:
    """A step's answers, one per request (None: none came), and how many missed the deadline."""

    answers: list[pb.ProposeResponse | None]
    late: int


class StepLink:
    """A draft client on a background loop, driven one step (one burst of requests) at a time."""

    def __init__(self, config: ProposerConfig, fingerprint: str, vocab_size: int) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="starsd-draft-link", daemon=True)
        self._thread.start()
        options = DraftClientOptions(deadline=config.timeout, tls_ca=config.tls_ca)
        self.drafts = list(config.drafts)  # the drafts known at start, first choice first
        discovery = None
        if config.source is not None:
            # Found live, as a StarSD target with --drafts-from: one lookup now (none found: vLLM decodes alone
            # until a later lookup finds one), then the client keeps following the DNS answer.
            discovery = DraftDiscovery(config.source, config.target_id)
            self._call(discovery.refresh())
            self.drafts = list(discovery.order)
        self.client = DraftClient(self.drafts, config.target_id, fingerprint, vocab_size, options, discovery=discovery)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def check(self) -> pb.InfoResponse | None:
        """The Info of the first draft that answers with this model's vocabulary; None when none answers.

        Raises :class:`VocabularyMismatch` when every draft that answered serves another vocabulary (the
        message holds both fingerprints): its proposals would be meaningless to this model.
        """
        mismatches: list[str] = []
        answered = 0
        for address in self.drafts:
            try:
                info = self._call(self.client.fetch_info(self.config.check_timeout, address))
            except grpc.aio.AioRpcError as exc:
                log.warning("the StarSD draft at %s is not reachable yet (%s)", address, exc.code().name)
                continue
            answered += 1
            try:
                check_draft_info(info, self.client.fingerprint, self.client.vocab_size)
            except VocabularyMismatch as exc:
                log.error("the StarSD draft at %s cannot serve this model: %s", address, exc)
                mismatches.append(str(exc))
                continue
            return info
        if answered and len(mismatches) == answered:
            raise VocabularyMismatch(mismatches[0])
        return None

    def start(self) -> None:
        """Start the client's connection loop (it reconnects in the background from now on)."""

        async def start() -> None:
            self.client.start()

        self._call(start())

    @property
    def connected(self) -> bool:
        return self.client.connected

    @property
    def generation(self) -> int:
        return self.client.generation

    def new_session_id(self) -> int:
        return self.client.new_session_id()

    def burst(
        self, requests: Sequence[pb.ProposeRequest], releases: Sequence[pb.ProposeRequest], deadline: float
    ) -> Burst:
        """Send a step's requests together (the draft batches them) and its releases; each request's answer,
        None for one not answered within ``deadline`` seconds or on a stream that broke."""
        if not requests and not releases:
            return Burst([], 0)
        future = asyncio.run_coroutine_threadsafe(self._burst(requests, releases, deadline), self._loop)
        try:
            return future.result(deadline + _HANDOVER_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return Burst([None] * len(requests), len(requests))

    async def _burst(
        self, requests: Sequence[pb.ProposeRequest], releases: Sequence[pb.ProposeRequest], deadline: float
    ) -> Burst:
        client = self.client
        for release in releases:
            client.send(release)
        futures = [client.send(req) for req in requests]
        waiting = [f for f in futures if f is not None]
        if waiting:
            await asyncio.wait(waiting, timeout=deadline)
        answers: list[pb.ProposeResponse | None] = []
        late = 0
        for req, f in zip(requests, futures, strict=True):
            if f is not None and f.done() and not f.cancelled():
                answers.append(f.result())  # None when the stream broke
                continue
            if f is not None:
                late += 1
                client.forget(req.session_id, req.seq)
                f.cancel()
            answers.append(None)
        return Burst(answers, late)

    def close(self) -> None:
        """Stop the client and its loop (vLLM never asks; tests and embedders do)."""
        if not self._loop.is_running():
            return
        try:
            self._call(self.client.stop(), timeout=5.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
