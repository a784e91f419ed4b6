"""The draft model in a process of its own.

The server's event loop (gRPC, sessions, answers) and the model's Python overhead (transformers' modules, a
few hundred tensor operations per step) would otherwise take turns on one interpreter lock, which pins the
draft at one core however much the batching saves. Here the server's compute thread sends each batch over
a pipe to a worker process that owns the model and every session's KV cache, and blocks (lock released)
until the answers come back.

Session state on the server side is a :class:`RemoteState` handle; when the server drops a session the
handle is collected and its id rides along with the next batch, so the worker frees that cache.
"""

from __future__ import annotations

import collections
import itertools
import logging
import multiprocessing
import signal
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from starsd.checkpoints import ModelLoadError, checkpoint_dir
from starsd.draft.proposers import ProposalRequest, ProposerFailed, ProposerInfo
from starsd.proposals import Proposal

log = logging.getLogger(__name__)


class ModelProcessGone(ProposerFailed):
    """The model process exited: the draft cannot compute any more."""


@dataclass(eq=False)
class RemoteState:
    """A session's handle: its KV cache and RNG live in the model process under ``id``."""

    id: int
    seed: int | None
    opened: bool = False  # the model process has created the state


class ProcessProposer:
    """A :class:`~starsd.draft.proposers.Proposer` whose model runs in a child process."""

    def __init__(
        self,
        model: str | Path,
        threads: int | None = None,
        start_timeout: float = 600.0,
        device: str = "cpu",
        dtype: str = "float32",
        cuda_graphs: str = "auto",
        ahead: str = "auto",
    ) -> None:
        checkpoint_dir(model)  # a wrong path is reported at once, before a process is started for it
        ctx = multiprocessing.get_context("spawn")  # no fork: the parent's threads and locks stay behind
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=worker_main,
            args=(child, str(model), threads, device, dtype, cuda_graphs, ahead),
            name="starsd-draft-model",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._ids = itertools.count(1)
        self._freed: collections.deque[int] = collections.deque()  # appended by finalizers, on any thread
        self._lock = threading.Lock()  # one batch in flight on the pipe
        self._gone = False  # its pipe broke: it exited, or is exiting
        try:
            if not self._conn.poll(start_timeout):
                raise ModelLoadError(f"the draft model process did not load {str(model)!r} in {start_timeout:.0f} s")
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            raise ModelLoadError(
                f"the draft model process exited while loading {str(model)!r} (exit code {self._process.exitcode})"
            ) from None
        if kind == "error":
            self._process.join(5)
            raise ModelLoadError(str(payload))
        self.info = ProposerInfo(*payload)
        self.pid = self._process.pid
        log.info("draft model %r loaded in process %s", self.info.model_name, self.pid)

    def new_state(self, seed: int | None) -> RemoteState:
        state = RemoteState(next(self._ids), seed)
        weakref.finalize(state, self._freed.append, state.id)
        return state

    def fileno(self) -> int:
        """The pipe's descriptor: readable when the answers of a sent batch are there, or the process is gone."""
        return self._conn.fileno()

    def propose_batch(self, batch: list[ProposalRequest]) -> list[Proposal]:
        message = self._batch_message(batch)
        with self._lock:
            self._send(message)
            return _proposals(self._recv())

    def send_batch(self, batch: list[ProposalRequest]) -> None:
        """Send a batch without waiting for its answers (:meth:`receive_batch` reads them)."""
        message = self._batch_message(batch)
        with self._lock:
            self._send(message)

    def receive_batch(self) -> list[Proposal]:
        with self._lock:
            return _proposals(self._recv())

    def _batch_message(self, batch: list[ProposalRequest]) -> tuple[str, list[int], list[Any]]:
        """The batch as the model process reads it, with the ids of the sessions dropped since the last one."""
        items = []
        for r in batch:
            state = r.state
            assert isinstance(state, RemoteState)
            items.append((state.id, None if state.opened else state.seed, r.new_tokens, r.gamma, r.params, r.top_k))
            state.opened = True
        return ("batch", self._take_freed(), items)

    def _take_freed(self) -> list[int]:
        freed: list[int] = []
        while self._freed:
            freed.append(self._freed.popleft())
        return freed

    def _send(self, message: tuple[str, Any, Any]) -> None:
        try:
            self._conn.send(message)
        except (OSError, BrokenPipeError) as exc:
            raise self._gone_error(exc) from None

    def _recv(self) -> tuple[str, Any]:
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._gone_error(exc) from None
        return kind, payload

    def _gone_error(self, exc: Exception) -> ModelProcessGone:
        self._gone = True
        self._process.join(2)  # its pipe closes as it exits: wait for the exit code
        code = self._process.exitcode
        return ModelProcessGone(f"the draft model process {self.pid} is gone (exit code {code}): {exc}")

    def draft_ahead(self, stop: Callable[[], bool]) -> None:
        pass  # the model process drafts ahead by itself after each batch, until the next message arrives

    def states_held(self) -> int:
        """How many session states the model process holds (after freeing those already dropped here)."""
        with self._lock:
            self._send(("count", self._take_freed(), None))
            _, count = self._recv()
        return int(count)

    def check(self) -> None:
        if self._gone or not self._process.is_alive():
            raise ModelProcessGone(f"the draft model process {self.pid} exited (exit code {self._process.exitcode})")

    def close(self, timeout: float = 5.0) -> None:
        if self._process.is_alive():
            try:
                with self._lock:
                    self._conn.send(("stop", None, None))
            except OSError:
                pass
            self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout)
        self._conn.close()


def _proposals(reply: tuple[str, Any]) -> list[Proposal]:
    kind, payload = reply
    if kind == "error":
        raise RuntimeError(payload)
    return [Proposal(ids, q_ids, q_probs, ahead) for ids, q_ids, q_probs, ahead in payload]


def worker_main(
    conn: Connection,
    model: str,
    threads: int | None,
    device: str = "cpu",
    dtype: str = "float32",
    cuda_graphs: str = "auto",
    ahead: str = "auto",
) -> None:
    """The model process: load the checkpoint, then answer batches until told to stop or the parent is gone;
    between a batch and the next message it drafts ahead (see :mod:`starsd.draft.runner`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server shuts us down
    from starsd.checkpoints import load_checkpoint, set_threads
    from starsd.draft.proposers import proposer_info
    from starsd.draft.runner import DraftRunner
    from starsd.proposals import DraftRequest

    set_threads(threads)
    try:
        loaded = load_checkpoint(model, device, dtype)
        runner = DraftRunner(loaded, cuda_graphs, ahead)
    except (ModelLoadError, ValueError) as exc:
        conn.send(("error", str(exc)))
        return
    info = proposer_info(loaded, runner.describe())
    fields = (info.model_name, info.vocab_size, info.vocab_fingerprint, info.max_context, info.device, info.dtype)
    conn.send(("ready", (*fields, info.passes)))
    states: dict[int, Any] = {}
    while True:
        try:
            kind, freed, items = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone
        if kind == "stop":
            return
        for sid in freed:
            states.pop(sid, None)
        if kind == "count":
            conn.send(("ok", len(states)))
            continue
        requests = []
        for sid, seed, tokens, gamma, params, top_k in items:
            state = states.get(sid)
            if state is None:
                state = states[sid] = runner.new_state(seed)
            requests.append(DraftRequest(state, tokens, gamma, params, top_k))
        try:
            proposals = runner.propose_batch(requests)
            reply: tuple[str, Any] = ("ok", [(p.token_ids, p.q_ids, p.q_probs, p.ahead) for p in proposals])
        except Exception as exc:  # one bad batch must not end the process: the server answers its error
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)
        if reply[0] == "ok":
            try:
                runner.draft_ahead(conn.poll)  # until the server sends anything
            except Exception:  # drafting ahead is an optimisation: the next request drafts from scratch
                log.exception("drafting ahead failed")
