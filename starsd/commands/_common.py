"""Small helpers shared by the commands: start-up errors, argument types and groups."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from starsd import defaults

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Options = TypeVar("Options", bound=DataclassInstance)

TERMINATION_LOG = Path("/dev/termination-log")

log = logging.getLogger("starsd")


def fail(message: str, code: int = 2) -> int:
    """Report a fatal start-up error on stderr and, inside Kubernetes, in the termination log.

    Kubernetes shows the termination log as the container's last state, and the operator surfaces it in the
    StarSDCluster's status, so a wrong model path reads as a clear reason rather than a crash loop.
    """
    print(f"starsd: error: {message}", file=sys.stderr)
    try:
        if TERMINATION_LOG.exists():
            TERMINATION_LOG.write_text(message[:4000])
    except OSError:
        pass
    return code


def from_flags(kind: type[Options], args: argparse.Namespace, **given: Any) -> Options:
    """The dataclass ``kind`` with each field set from the flag named after it (``--max-batch``: ``max_batch``),
    or from ``given``; a field that no flag names keeps its default."""
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(kind) if f.init and hasattr(args, f.name)}
    return kind(**{**flags, **given})


def tcp_port(text: str) -> int:
    """A TCP port number, 0..65535 (what 0 means is the flag's to say: a free port, or none)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (0..65535)")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"{text} is not > 0")
    return value


def int_list(minimum: int = 1, noun: str = "integers", subject: str = "values") -> Callable[[str], tuple[int, ...]]:
    """An argument type for ``"1,8,16"``: the integers in the order given, each ``>= minimum``; the messages
    name the ``noun`` expected and the ``subject`` that must be large enough."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {noun}, got {text!r}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"{subject} must be >= {minimum}, got {text!r}")
        return values

    return parse


positive_ints = int_list()  # batch sizes, concurrencies: "1,8"
counts = int_list(minimum=0)  # sizes that may be zero: "0,128,1024"
target_counts = int_list(noun="target counts", subject="target counts")  # "1,2,4" (--n, --drafts)


def add_listen_args(parser: argparse.ArgumentParser, protocol: str, port: int, note: str = "") -> None:
    """``--port`` (``protocol``'s, ``note`` added to its help) and ``--host``, the same on every server."""
    parser.add_argument("--port", type=tcp_port, default=port, help=f"{protocol} port" + (f"; {note}" if note else ""))
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    """``--threads``, torch's intra-op threads, on every command that runs a model in its own process."""
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: $STARSD_TORCH_THREADS or 1)")


def add_profile_args(
    group: argparse._ArgumentGroup, default: str = "", tc: str = "one-way transfer time (request or response)"
) -> None:
    """``--profile`` or ``--profile-json``, an accelerator profile (``default`` when neither is given), and the
    flags that override its times and proposal length: ``--tp``, ``--tc`` (described as ``tc``), ``--gamma``."""
    group.add_argument(
        "--profile",
        help="a named accelerator profile (see `starsd bench profiles`)" + (f"; default {default}" if default else ""),
    )
    group.add_argument("--profile-json", metavar="FILE", help="an accelerator profile of your own (JSON)")
    group.add_argument("--tp", type=float, help="target verify time per round, seconds")
    group.add_argument("--tc", type=float, help=f"{tc}, seconds")
    group.add_argument("--gamma", type=int, help="draft tokens proposed per round")


def add_gamma_arg(parser: argparse.ArgumentParser, note: str = "") -> None:
    """``--gamma``, the same default and range on every command that starts a target."""
    parser.add_argument(
        "--gamma",
        type=int,
        default=defaults.GAMMA,
        help=f"tokens drafted per round, {defaults.GAMMA_MIN}..{defaults.GAMMA_MAX} (default {defaults.GAMMA}){note}",
    )


def gamma_error(gamma: int) -> str | None:
    """The complaint about ``--gamma`` outside its range, or None."""
    if defaults.GAMMA_MIN <= gamma <= defaults.GAMMA_MAX:
        return None
    return f"--gamma must be in {defaults.GAMMA_MIN}..{defaults.GAMMA_MAX}, got {gamma}"


def add_placement_args(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--dtype`` (see starsd.devices), the same on every command that loads a model."""
    from starsd.devices import DEVICE_CHOICES, DTYPES

    parser.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help=f"where the model runs: {DEVICE_CHOICES} (default auto: CUDA when a GPU is visible, else the CPU)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="the model's precision (default auto: bfloat16 on CUDA, float32 on the CPU)",
    )


def add_cuda_graphs_arg(parser: argparse.ArgumentParser, steps: str = "the draft's decoding steps") -> None:
    """``--cuda-graphs`` (see starsd.cuda_graphs) for ``steps``."""
    parser.add_argument(
        "--cuda-graphs",
        default="auto",
        choices=("auto", "on", "off"),
        help=f"replay {steps} from captured CUDA graphs (default auto: on with CUDA, "
        "off on the CPU; on: refuse to start without CUDA)",
    )


def placement_error(args: argparse.Namespace) -> str | None:
    """The first problem with ``--device``/``--dtype``, or None (checked before any model is loaded): a flag
    that names no device, or ``cuda`` where no GPU is usable (a CPU-only torch build, no visible GPU)."""
    from starsd.devices import check_device, check_dtype, start_check

    try:
        check_device(args.device)
        check_dtype(args.dtype)
    except ValueError as exc:
        return str(exc)
    return start_check(args.device)


def add_api_key_args(parser: argparse.ArgumentParser) -> None:
    """``--api-key`` and ``--api-key-file`` (with ``$STARSD_API_KEY``: see starsd.openai_api.auth)."""
    from starsd.openai_api.auth import ENV_API_KEY

    parser.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="a key clients must send as 'Authorization: Bearer KEY' on every route but /health, /healthz, "
        "/readyz, /metrics and /version (repeat it for several; a key on the command line shows in the "
        f"process list, so prefer --api-key-file or ${ENV_API_KEY}); without any key every route is open",
    )
    parser.add_argument(
        "--api-key-file",
        action="append",
        type=Path,
        metavar="FILE",
        help="a file of accepted keys, one per line ('#' starts a comment); may be repeated",
    )


def api_keys_or_error(args: argparse.Namespace) -> list[str] | str:
    """The keys of ``--api-key``, ``--api-key-file`` and ``$STARSD_API_KEY``, or the complaint about them
    (which never shows a key). The flags' values are dropped from ``args`` once read."""
    from starsd.openai_api.auth import ApiKeyError, load_keys

    try:
        keys = load_keys(args.api_key, args.api_key_file, os.environ)
    except ApiKeyError as exc:
        return str(exc)
    finally:
        args.api_key = None  # the keys live on only as the server's digests
    return keys


def names_among(known: tuple[str, ...], expected: str | None = None) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for a comma-separated choice of one or more of ``known``, in the order given; a refusal
    says what was expected (``expected``, by default ``some of`` the known names)."""
    wanted = expected or f"some of {','.join(known)}"

    def parse(text: str) -> tuple[str, ...]:
        values = tuple(x.strip() for x in text.split(",") if x.strip())
        if not values or any(v not in known for v in values):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return values

    return parse
