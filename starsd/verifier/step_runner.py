"""What the target's engine needs of a model: the step-runner interface.

:class:`starsd.verifier.engine.TargetEngine` runs its completions' rounds through a :class:`StepRunner`: it takes
a session for each completion (reserving its place), hands the scheduler's ready rows to :meth:`StepRunner.step`
one step at a time, and gives the session back when the completion ends. Two runners implement it: the model
runner (:class:`starsd.verifier.runner.TargetRunner`, a real forward pass and verification) and the benchmarks'
emulated runner (:class:`starsd.bench.emulated.EmulatedTargetRunner`, a timed hold and drawn acceptance). Both
commit a row's outcome with the one rule :func:`starsd.verifier.runner.commit`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from starsd.verifier.runner import RowOutcome, StepRow, TargetSession


class StepRunner(Protocol):
    """Runs the steps of many sessions on one target model, one step at a time (on the engine's model thread)."""

    @property
    def device(self) -> torch.device:
        """Where a completion's own tensors live (its random stream, its penalty counts)."""
        ...

    @property
    def vocab_size(self) -> int:
        """The ids a row's tokens and drafts may hold: ``0..vocab_size - 1``."""
        ...

    def new_session(self, prompt: list[int]) -> TargetSession:
        """Reserve a session for a completion of ``prompt`` (at least one token; ValueError otherwise)."""
        ...

    def step(self, rows: list[StepRow]) -> list[RowOutcome]:
        """Run one step over ``rows`` (at most one row per session) and commit each; one outcome per row."""
        ...

    def release(self, session: TargetSession) -> None:
        """Give back what a finished session holds (called on the model thread, once no step holds it)."""
        ...
