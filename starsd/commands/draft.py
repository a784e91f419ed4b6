"""``starsd draft``: serve the draft model over gRPC."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from starsd import defaults
from starsd.commands._common import (
    add_cuda_graphs_arg,
    add_listen_args,
    add_placement_args,
    add_threads_arg,
    fail,
    from_flags,
    placement_error,
    tcp_port,
)

log = logging.getLogger("starsd.draft")  # the `starsd draft` command's own log


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="local Hugging Face checkpoint of the draft model")
    add_listen_args(parser, "gRPC", defaults.DRAFT_GRPC_PORT, "0 picks a free one")
    parser.add_argument(
        "--metrics-port",
        type=tcp_port,
        default=defaults.DRAFT_METRICS_PORT,
        help="HTTP port for /v1/load, /metrics, /healthz",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help=f"requests drafted together per step (default {defaults.DRAFT_MAX_BATCH} with --model; 1 when emulating "
        "without --batch-curve)",
    )
    parser.add_argument(
        "--schedule",
        choices=defaults.DRAFT_SCHEDULES,
        default=defaults.DRAFT_SCHEDULES[0],
        help="order of waiting requests",
    )
    parser.add_argument("--max-sessions", type=int, default=defaults.DRAFT_MAX_SESSIONS, help="sessions held at once")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.DRAFT_IDLE_TIMEOUT_SECONDS,
        help="seconds before an idle session is freed",
    )
    parser.add_argument("--max-gamma", type=int, default=defaults.GAMMA_MAX, help="largest gamma accepted")
    parser.add_argument(
        "--model-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the model in a process of its own, so that serving and drafting do not share one Python "
        "interpreter lock (default; --no-model-process keeps it in the server's process)",
    )
    parser.add_argument(
        "--draft-ahead",
        default="auto",
        choices=("auto", "on", "off"),
        help="while the targets verify, extend greedy sessions' drafts past the proposal (the target's expected "
        "next token, then a whole next proposal), so that a fully accepted round is answered at once; it runs "
        "only while no request waits (default auto: on with CUDA, off on the CPU, whose cores the other "
        "processes need)",
    )
    add_threads_arg(parser)
    parser.add_argument(
        "--cpus",
        metavar="LIST",
        help="CPU cores the draft (server and model process) runs on, e.g. 0 or 0-3,8 (default: all it may use); "
        "beside vLLM on a shared machine, its model workers' cores (see docs/vllm.md)",
    )
    add_placement_args(parser)
    add_cuda_graphs_arg(parser)
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate: serve gRPC over TLS (with --tls-key)")
    parser.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    emu = parser.add_argument_group("emulation (benchmarks: no model, a fixed service time)")
    emu.add_argument(
        "--emulate-service-time", type=float, metavar="SECONDS", help="emulate a draft accelerator instead of --model"
    )
    emu.add_argument(
        "--batch-curve",
        help='emulated batch times, e.g. "1:0.004,8:0.006" (with --max-batch; without a 1: point, '
        "--emulate-service-time is Tq(1))",
    )
    emu.add_argument(
        "--emulate-token-time", type=float, default=0.0, metavar="SECONDS", help="extra emulated time per drafted token"
    )
    emu.add_argument("--vocab-size", type=int, default=32000, help="vocabulary of the emulated draft")


def run(args: argparse.Namespace) -> int:
    from starsd.checkpoints import ModelLoadError
    from starsd.draft.core import DraftConfig
    from starsd.draft.proposers import EmulatedProposer, ModelProposer, Proposer
    from starsd.draft.server import DraftServer, DraftServerOptions, serve_forever
    from starsd.system_model import BatchCurve

    if (args.model is None) == (args.emulate_service_time is None):
        return fail("give exactly one of --model PATH or --emulate-service-time SECONDS")
    if bool(args.tls_cert) != bool(args.tls_key):
        return fail("--tls-cert and --tls-key go together")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not path.is_file():
            return fail(f"{flag} {path}: no such file (PEM)")
    if not args.idle_timeout > 0:  # NaN too
        return fail(f"--idle-timeout must be > 0, got {args.idle_timeout}")
    if args.max_batch is None:
        args.max_batch = defaults.DRAFT_MAX_BATCH if args.model is not None or args.batch_curve else 1
    if args.max_batch < 1 or args.max_gamma < 1 or args.max_sessions < 1:
        return fail("--max-batch, --max-gamma and --max-sessions must be >= 1")
    if (problem := placement_error(args)) is not None:
        return fail(problem)
    if args.cpus is not None:
        from starsd.cpus import CpuListError, format_cpu_list, pin

        try:
            cpus = pin(args.cpus)  # before the model process starts: it inherits the cores
        except CpuListError as exc:
            return fail(f"--cpus: {exc}")
        log.info("the draft runs on CPU %s", format_cpu_list(cpus))
    proposer: Proposer
    try:
        if args.model is not None and args.model_process:
            from starsd.draft.model_process import ProcessProposer

            proposer = ProcessProposer(
                args.model,
                args.threads,
                device=args.device,
                dtype=args.dtype,
                cuda_graphs=args.cuda_graphs,
                ahead=args.draft_ahead,
            )
        elif args.model is not None:
            from starsd.checkpoints import load_checkpoint, set_threads

            set_threads(args.threads)
            loaded = load_checkpoint(args.model, args.device, args.dtype)
            proposer = ModelProposer(loaded, args.cuda_graphs, args.draft_ahead)
        else:
            service = args.emulate_service_time
            curve = BatchCurve.parse(args.batch_curve, unbatched=service) if args.batch_curve else None
            proposer = EmulatedProposer(args.emulate_service_time, args.vocab_size, curve, args.emulate_token_time)
    except (ModelLoadError, ValueError) as exc:
        return fail(str(exc))
    config, options = from_flags(DraftConfig, args), from_flags(DraftServerOptions, args)
    try:
        failure = asyncio.run(serve_forever(DraftServer(proposer, config, options)))
    except OSError as exc:
        return fail(str(exc))
    finally:
        proposer.close()
    if failure:
        return fail(f"the draft stopped: {failure}", code=1)
    return 0
