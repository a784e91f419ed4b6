"""What the draft server runs per request: a real model, or an emulated accelerator for benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from starsd.proposals import DraftRequest, Proposal
from starsd.system_model import BatchCurve

if TYPE_CHECKING:
    from starsd.checkpoints import LoadedModel

# One request's work, as the compute thread sees it (state: the proposer's per-session state).
ProposalRequest = DraftRequest


@dataclass(frozen=True)
class ProposerInfo:
    model_name: str
    vocab_size: int
    vocab_fingerprint: str
    max_context: int
    device: str = "cpu"  # where the model runs, and in which dtype (reported on /v1/load and at start)
    dtype: str = "float32"
    passes: str = ""  # how the runner drafts, for the start-up line (starsd.draft.runner.DraftRunner.describe)


def proposer_info(loaded: LoadedModel, passes: str = "") -> ProposerInfo:
    device, _, dtype = loaded.placement.describe().partition(" ")
    return ProposerInfo(loaded.name, loaded.vocab_size, loaded.fingerprint, loaded.max_context, device, dtype, passes)


class ProposerFailed(RuntimeError):
    """The proposer cannot compute any more (its model process died): the draft must be restarted."""


class Proposer(Protocol):
    info: ProposerInfo

    def new_state(self, seed: int | None) -> Any: ...

    def propose_batch(self, batch: list[ProposalRequest]) -> list[Proposal]: ...

    def draft_ahead(self, stop: Callable[[], bool]) -> None:
        """Idle (no request waits): draft ahead for the latest batch's greedy sessions until ``stop()``."""

    def check(self) -> None:
        """Raise :class:`ProposerFailed` if the proposer can no longer compute (called while idle)."""

    def close(self) -> None: ...


@runtime_checkable
class PipedProposer(Proposer, Protocol):
    """A proposer whose model answers on a file descriptor (a process of its own): a batch is sent, and its
    answers are read once the descriptor is readable, so the server's event loop drives it with no thread in
    between (each hand-over between threads costs a wake-up on the path of every round)."""

    def fileno(self) -> int: ...

    def send_batch(self, batch: list[ProposalRequest]) -> None: ...

    def receive_batch(self) -> list[Proposal]:
        """The answers of the batch sent last; raises :class:`ProposerFailed` if the model is gone (the
        descriptor also becomes readable when it exits)."""
        ...


class ModelProposer:
    """Proposals from a real draft checkpoint (one forward pass per token, per session)."""

    def __init__(self, loaded: LoadedModel, cuda_graphs: str = "auto", ahead: str = "auto") -> None:
        from starsd.draft.runner import DraftRunner  # torch: only where the model runs in this process

        self.runner = DraftRunner(loaded, cuda_graphs, ahead)
        self.info = proposer_info(loaded, self.runner.describe())

    def new_state(self, seed: int | None) -> Any:
        return self.runner.new_state(seed)

    def propose_batch(self, batch: list[ProposalRequest]) -> list[Proposal]:
        return self.runner.propose_batch(batch)

    def draft_ahead(self, stop: Callable[[], bool]) -> None:
        self.runner.draft_ahead(stop)

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


def curve_time(curve: BatchCurve, batch: int) -> float:
    """Service time of a batch: the curve's ``Tq(B)`` within its points, extended along its last slope beyond
    them (a single point: proportional to the batch), since an emulated draft must serve any batch size."""
    if batch <= curve.max_batch:
        return curve.tq(batch)
    if len(curve.points) == 1:
        return curve.tq(1) * batch  # one point, B=1: assume linear growth beyond it
    (b0, t0), (b1, t1) = curve.points[-2:]
    return t1 + (t1 - t0) / (b1 - b0) * (batch - b1)


class EmulatedProposer:
    """Emulates a draft accelerator: holds for the service time (releasing the GIL, as kernels do).

    Proposes token id ``i % vocab_size`` at position i: emulated targets draw acceptance themselves.
    A request costs its batch's time from the curve, plus ``token_time`` per proposed token (the largest
    gamma in the batch), so that gamma's cost shows as it does on a real draft.
    """

    def __init__(
        self,
        service_time: float,
        vocab_size: int = 32000,
        batch_curve: BatchCurve | None = None,
        token_time: float = 0.0,
    ):
        if service_time < 0 or token_time < 0:
            raise ValueError("the emulated service and token times must be >= 0")
        self.service_time = service_time
        self.curve = batch_curve
        self.token_time = token_time
        self.info = ProposerInfo("emulated", vocab_size, "emulated", 1 << 20, device="emulated", dtype="emulated")

    def new_state(self, seed: int | None) -> Any:
        return None

    def propose_batch(self, batch: list[ProposalRequest]) -> list[Proposal]:
        n = len(batch)
        service = self.service_time * n if self.curve is None else curve_time(self.curve, n)  # no curve: no gain
        _hold(service + self.token_time * max(r.gamma for r in batch))
        return [Proposal(token_ids=[i % self.info.vocab_size for i in range(r.gamma)]) for r in batch]

    def draft_ahead(self, stop: Callable[[], bool]) -> None:
        pass  # proposals of an emulated draft are fixed: nothing to draft ahead

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


def _hold(seconds: float) -> None:
    """Hold precisely: a coarse sleep (the GIL released, as kernels release it), then a short busy spin.

    The spin does not yield: yielding the CPU near the end let the scheduler overshoot by up to milliseconds.
    """
    end = time.perf_counter() + seconds
    if seconds > 0.0003:
        time.sleep(seconds - 0.0002)
    while time.perf_counter() < end:
        pass
