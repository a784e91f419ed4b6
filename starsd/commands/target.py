"""``starsd target``: serve a target model over HTTP (OpenAI API), verifying the shared draft's proposals."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from pathlib import Path

from starsd import defaults
from starsd.assignment import ordered_drafts
from starsd.commands._common import (
    add_api_key_args,
    add_cuda_graphs_arg,
    add_gamma_arg,
    add_listen_args,
    add_placement_args,
    add_threads_arg,
    api_keys_or_error,
    fail,
    gamma_error,
    placement_error,
)
from starsd.verifier.discovery import RESOLVE_SECONDS, DraftSourceError, parse_drafts_from
from starsd.verifier.draft_pool import PROBE_SECONDS, DraftListError, parse_draft_addresses

log = logging.getLogger("starsd.target")  # the `starsd target` command's own log


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, help="local Hugging Face checkpoint of the target")
    parser.add_argument(
        "--draft",
        default="",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the draft server, or a comma-separated list of every draft of the star (draft 0 first; the same "
        "list on every target): this target uses the draft its --id's ordinal picks, moves to the next that "
        "answers when it is gone and back when it returns with room; an empty entry, an entry without a port "
        "or one listed twice is an error; empty: decode alone (target-only)",
    )
    parser.add_argument(
        "--drafts-from",
        default="",
        metavar="dns:HOST:PORT",
        help="find the drafts live instead of --draft: every address HOST resolves to (in Kubernetes the drafts' "
        "headless Service, NAME-draft-pods.NAMESPACE.svc) is a draft on PORT; looked up again every "
        "--drafts-resolve-interval seconds, and this target picks its draft by rendezvous hashing of its --id "
        "(the next-highest are its failover order), so a change of drafts moves only the targets it must; a "
        "failed lookup keeps the drafts last found",
    )
    parser.add_argument(
        "--drafts-resolve-interval",
        type=float,
        default=RESOLVE_SECONDS,
        help="with --drafts-from: seconds between lookups",
    )
    add_listen_args(parser, "HTTP", defaults.TARGET_HTTP_PORT)
    add_gamma_arg(parser)
    parser.add_argument(
        "--adaptive-gamma",
        action="store_true",
        help="choose gamma per session and round with the system model (--gamma is then the most asked for)",
    )
    parser.add_argument("--id", default=socket.gethostname(), help="this target's id on the draft (default: hostname)")
    parser.add_argument("--served-model-name", help="the model name clients send (default: the checkpoint's name)")
    parser.add_argument(
        "--draft-timeout",
        type=float,
        default=defaults.DRAFT_TIMEOUT_SECONDS,
        help="seconds a round waits for the draft before decoding alone",
    )
    parser.add_argument(
        "--draft-probe-interval",
        type=float,
        default=PROBE_SECONDS,
        help="with several drafts: seconds between checks of this target's first-choice draft while it uses another",
    )
    parser.add_argument(
        "--draft-check-timeout", type=float, default=5.0, help="seconds to wait for the draft's vocabulary check"
    )
    batching = parser.add_argument_group("batching (continuous: one forward pass per step over every ready session)")
    batching.add_argument(
        "--max-num-seqs",
        type=int,
        default=defaults.MAX_NUM_SEQS,
        help="completions running at once, and rows of one step",
    )
    batching.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        help="key/value pool size in tokens; each running completion gets a slot as long as the longest running "
        "one's prompt + max_tokens + gamma, and running x longest stays within it "
        "(default: --max-num-seqs full contexts on the CPU; on CUDA, what --gpu-memory-fraction leaves)",
    )
    batching.add_argument(
        "--gpu-memory-fraction",
        type=float,
        default=defaults.GPU_MEMORY_FRACTION,
        help="CUDA only: the share of the GPU's memory the weights and the key/value cache may use",
    )
    batching.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=defaults.MAX_PREFILL_TOKENS,
        help="prompt tokens fed per session and step; longer prompts are prefilled in chunks",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=defaults.TARGET_MAX_CONCURRENCY,
        help="completions accepted at once, running or waiting for a slot; more get 429",
    )
    parser.add_argument(
        "--max-tokens-cap", type=int, default=defaults.MAX_TOKENS_CAP, help="largest max_tokens accepted"
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=defaults.MAX_BODY_BYTES, help="largest request body in bytes"
    )
    parser.add_argument("--top-k", type=int, default=defaults.PROPOSAL_TOP_K, help="support of sampled proposals")
    add_threads_arg(parser)
    parser.add_argument("--draft-tls-ca", type=Path, help="PEM CA bundle: reach the draft over TLS")
    parser.add_argument(
        "--chat-template",
        type=Path,
        help="a Jinja chat template file for /v1/chat/completions (default: the checkpoint's own)",
    )
    add_api_key_args(parser)
    add_placement_args(parser)
    add_cuda_graphs_arg(parser, "the target's verify steps")


def run(args: argparse.Namespace) -> int:
    from starsd.checkpoints import ModelLoadError, load_checkpoint, set_threads
    from starsd.cuda_graphs import graphs_enabled

    if (problem := gamma_error(args.gamma)) is not None:
        return fail(problem)
    if args.max_concurrency < 1 or args.max_tokens_cap < 1:
        return fail("--max-concurrency and --max-tokens-cap must be >= 1")
    if args.max_num_seqs < 1 or args.max_prefill_tokens < 1 or (args.kv_cache_tokens or 1) < 1:
        return fail("--max-num-seqs, --max-prefill-tokens and --kv-cache-tokens must be >= 1")
    if not 0 < args.gpu_memory_fraction <= 1:
        return fail(f"--gpu-memory-fraction must be in (0, 1], got {args.gpu_memory_fraction}")
    if (problem := placement_error(args)) is not None:
        return fail(problem)
    try:
        args.drafts = ordered_drafts(args.id, parse_draft_addresses(args.draft))
        args.source = parse_drafts_from(args.drafts_from) if args.drafts_from.strip() else None
    except (DraftListError, DraftSourceError) as exc:
        return fail(str(exc))
    if args.source is not None and args.drafts:
        return fail("give the drafts either as a --draft list or with --drafts-from, not both")
    for flag in ("drafts_resolve_interval", "draft_probe_interval", "draft_timeout", "draft_check_timeout"):
        if not getattr(args, flag) > 0:  # NaN too
            return fail(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if args.max_body_bytes < 1 or args.top_k < 1:
        return fail(f"--max-body-bytes and --top-k must be >= 1, got {args.max_body_bytes} and {args.top_k}")
    if args.draft_tls_ca is not None and not args.draft_tls_ca.is_file():
        return fail(f"--draft-tls-ca {args.draft_tls_ca}: no such file (a PEM CA bundle)")
    keys = api_keys_or_error(args)
    if isinstance(keys, str):
        return fail(keys)
    args.api_keys = keys
    from starsd.openai_api.chat import load_chat_template

    try:
        args.chat_template_text = load_chat_template(args.chat_template)
    except ValueError as exc:
        return fail(str(exc))
    set_threads(args.threads)
    try:
        loaded = load_checkpoint(args.model, args.device, args.dtype)
        graphs_enabled(args.cuda_graphs, loaded.device)  # --cuda-graphs on without CUDA: refused
    except (ModelLoadError, ValueError) as exc:
        return fail(str(exc))
    try:
        return asyncio.run(_serve(args, loaded))
    except OSError as exc:
        return fail(f"cannot serve on {args.host}:{args.port}: {exc}")


async def _serve(args: argparse.Namespace, loaded: object) -> int:
    import grpc
    from aiohttp import web

    from starsd.checkpoints import LoadedModel
    from starsd.openai_api.app import TargetApp, TargetServerOptions
    from starsd.openai_api.auth import KeyRing
    from starsd.verifier.discovery import DraftDiscovery
    from starsd.verifier.draft_client import (
        DraftClient,
        DraftClientOptions,
        VocabularyMismatch,
        check_draft_info,
    )
    from starsd.verifier.engine import BatchOptions, TargetEngine
    from starsd.verifier.memory import kv_budget_tokens

    assert isinstance(loaded, LoadedModel)
    client = None
    discovery = None
    if args.source is not None:
        discovery = DraftDiscovery(args.source, args.id, interval=args.drafts_resolve_interval)
        await discovery.refresh()  # none found yet: decode alone until the next lookup finds one
        args.drafts = list(discovery.order)
    if args.drafts or discovery is not None:
        options = DraftClientOptions(
            deadline=args.draft_timeout,
            top_k=args.top_k,
            tls_ca=args.draft_tls_ca,
            probe_interval=args.draft_probe_interval,
        )
        client = DraftClient(args.drafts, args.id, loaded.fingerprint, loaded.vocab_size, options, discovery=discovery)
        # Every draft that answers must share the vocabulary; the target refuses to start only when none that
        # answered does (with one draft: when it answers with another vocabulary, as always).
        mismatches: list[str] = []
        for address in args.drafts:
            try:
                info = await client.fetch_info(args.draft_check_timeout, address)
                check_draft_info(info, loaded.fingerprint, loaded.vocab_size)
                break
            except VocabularyMismatch as exc:
                log.error("the draft at %s cannot serve this target: %s", address, exc)
                mismatches.append(str(exc))
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "the draft at %s is not reachable yet (%s): decoding alone until a draft is",
                    address,
                    exc.code().name,
                )
        else:
            if mismatches and len(mismatches) == len(args.drafts):
                return fail(mismatches[0])
        client.start()
    kv_tokens = args.kv_cache_tokens or kv_budget_tokens(loaded, args.max_num_seqs, args.gpu_memory_fraction)
    batching = BatchOptions(args.max_num_seqs, kv_tokens, args.max_prefill_tokens)
    engine = TargetEngine(
        loaded,
        client,
        gamma=args.gamma,
        adaptive_gamma=args.adaptive_gamma,
        batching=batching,
        cuda_graphs=args.cuda_graphs,
    )
    app = TargetApp(
        engine,
        TargetServerOptions(
            target_id=args.id,
            served_model=args.served_model_name or loaded.name,
            max_concurrency=args.max_concurrency,
            max_body_bytes=args.max_body_bytes,
            max_tokens_cap=args.max_tokens_cap,
            chat_template=args.chat_template_text,
            api_keys=KeyRing(args.api_keys),
        ),
    )
    runner = app.runner(shutdown_timeout=30.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    log.info(
        "target %r serving model %r on %s on http://%s:%d (draft %s, gamma %d, up to %d sessions per step, "
        "key/value budget %d tokens; %s)",
        args.id,
        app.options.served_model,
        loaded.placement.describe(),
        args.host,
        args.port,
        args.drafts_from or ",".join(args.drafts) or "none",
        args.gamma,
        args.max_num_seqs,
        engine.budget.kv_tokens,
        _key_note(len(app.options.api_keys)),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("target %r shutting down: finishing in-flight completions", args.id)
    await runner.cleanup()
    if client:
        await client.stop()
    engine.close()
    return 0


def _key_note(count: int) -> str:
    """How the start-up line describes the keys: how many, never which."""
    if count == 0:
        return "no API key: every route is open"
    return f"every route but the probes, /metrics and /version needs one of {count} API key{'s' if count > 1 else ''}"
