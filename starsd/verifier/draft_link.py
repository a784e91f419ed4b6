"""One completion's session on the draft: the per-round request, its deadline, and the answer decoded.

A round asks through :meth:`DraftLink.propose`; ``None`` means the round decodes alone (the draft is away, late,
refused the request, or answered something that cannot be verified, see :mod:`starsd.proposal_codec`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from starsd import proposal_codec as codec
from starsd.adaptive import AcceptanceEstimate, choose_gamma, ewma
from starsd.proposals import Proposal
from starsd.proto import starsd_pb2 as pb
from starsd.sampling import SamplingParams
from starsd.verifier.draft_client import DraftClient

log = logging.getLogger(__name__)


class DraftLink:
    """One completion's session on the draft: what it has told the draft, and its sequence numbers."""

    def __init__(self, client: DraftClient, params: SamplingParams, seed: int) -> None:
        self.client = client
        self.params = params
        self.seed = seed
        self.session_id = 0
        self.seq = 0
        self.synced = 0  # committed tokens the draft already knows
        self.generation = -1
        self.cooldown = 0
        self.rtt = 0.0
        # What adaptive gamma needs: this session's acceptance and the draft's measured costs.
        self.acceptance = AcceptanceEstimate()
        self.token_time = 0.0  # draft seconds per proposed token
        self.transfer_time = float("nan")  # one-way transfer and protocol overhead (mean, queueing excluded)
        self.draft_sessions = 1

    def _reset(self) -> None:
        self.session_id, self.seq, self.synced = 0, 0, 0

    def _request(self, committed: list[int], gamma: int, verify_seconds: float) -> pb.ProposeRequest:
        """The next request of this session: only the tokens committed since the last one."""
        client = self.client
        if self.generation != client.generation:  # a new stream: the draft lost this session
            self._reset()
            self.generation = client.generation
        if self.session_id == 0:
            self.session_id = client.new_session_id()
        self.seq += 1
        req = pb.ProposeRequest(
            target_id=client.target_id,
            session_id=self.session_id,
            seq=self.seq,
            tokens=committed[self.synced :],
            gamma=gamma,
            sample=not self.params.greedy,
            temperature=0.0 if self.params.greedy else self.params.temperature,
            top_p=self.params.top_p,
            top_k=client.options.top_k,
            seed=self.seed,
            verify_seconds=verify_seconds,
            rtt_seconds=self.rtt,
        )
        demand = client.demand()
        req.running_requests, req.waiting_requests, req.occupancy = demand.running, demand.waiting, demand.occupancy
        return req

    async def propose(self, committed: list[int], gamma: int, verify_seconds: float) -> Proposal | None:
        client = self.client
        if self.cooldown > 0:
            self.cooldown -= 1
            return None
        if not client.connected:
            return None
        req = self._request(committed, gamma, verify_seconds)
        sent = time.perf_counter()
        future = client.send(req)
        if future is None:
            return None
        try:
            # not asyncio.wait_for, which can lose the cancellation of a client that left (pyproject.toml's ban)
            async with asyncio.timeout(client.options.deadline):
                response = await future
        except TimeoutError:
            # The draft may yet process this request: its view of the session is unknown, so drop the session.
            client.forget(self.session_id, self.seq)
            self.release()
            self.cooldown = client.options.cooldown_rounds
            return None
        if response is None:
            self._reset()
            return None
        self.rtt = time.perf_counter() - sent
        if response.error_code:
            log.warning("draft refused session %d seq %d: %s", self.session_id, self.seq, response.error_message)
            self.release()
            return None
        try:
            proposal = codec.decode(response, gamma, client.vocab_size, sampled=not self.params.greedy)
        except codec.MalformedProposal as exc:
            log.warning("malformed draft answer for session %d seq %d: %s", self.session_id, self.seq, exc)
            client.on_malformed()
            self.release()
            return None
        self.synced = len(committed)
        self._measured(response)
        return proposal

    def _measured(self, response: pb.ProposeResponse) -> None:
        """Take the draft's costs from an answer (what adaptive gamma needs)."""
        if response.token_ids:
            self.token_time = response.service_seconds / len(response.token_ids)
        self.transfer_time = ewma(
            self.transfer_time, max(0.0, (self.rtt - response.service_seconds - response.queue_seconds) / 2)
        )
        self.draft_sessions = max(1, response.draft_sessions)

    def next_gamma(self, max_gamma: int, verify_seconds: float) -> int:
        """Adaptive gamma for the next round, from this session's measurements (see starsd.adaptive)."""
        tc = 0.0 if math.isnan(self.transfer_time) else self.transfer_time
        return choose_gamma(self.acceptance.alpha, self.token_time, verify_seconds, tc, self.draft_sessions, max_gamma)

    def release(self) -> None:
        """Free this session on the draft (fire and forget) and start afresh next time."""
        if self.session_id and self.generation == self.client.generation:
            self.client.send(
                pb.ProposeRequest(
                    target_id=self.client.target_id,
                    session_id=self.session_id,
                    seq=self.seq + 1,
                    release=True,
                )
            )
        self._reset()
