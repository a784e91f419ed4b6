"""The proposer's configuration, from environment variables (vLLM constructs it with its own config only).

Every problem is a :class:`ConfigError` that names the variable, raised when vLLM loads the proposer, so that
`vllm serve` stops at start-up with the reason instead of serving without a draft.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from starsd import defaults
from starsd.assignment import ordered_drafts
from starsd.verifier.discovery import SCHEME as DNS_SCHEME
from starsd.verifier.discovery import DnsSource, DraftSourceError, parse_drafts_from
from starsd.verifier.draft_pool import DraftListError, parse_draft_addresses

# The variables, with what each holds (docs/vllm.md lists them too).
# HOST:PORT[,HOST:PORT...] or unix:PATH: the draft(s), as `starsd target --draft`; or dns:HOST:PORT: the drafts
# found live behind one DNS name (a StarSDCluster's headless Service NAME-draft-pods), as `--drafts-from`
DRAFT = "STARSD_DRAFT"
TARGET_ID = "STARSD_TARGET_ID"  # this replica's id on the draft (default: the host name)
TLS_CA = "STARSD_DRAFT_TLS_CA"  # PEM CA bundle: reach the draft over TLS
GAMMA = "STARSD_GAMMA"  # tokens asked per row (default and most: vLLM's num_speculative_tokens)
TIMEOUT = "STARSD_DRAFT_TIMEOUT"  # seconds a step waits for the draft's answers at most
CHECK_TIMEOUT = "STARSD_DRAFT_CHECK_TIMEOUT"  # seconds to wait at start for the draft's vocabulary check
COOLDOWN_STEPS = "STARSD_COOLDOWN_STEPS"  # steps decoded alone after a step the draft missed
IDLE_STEPS = "STARSD_SESSION_IDLE_STEPS"  # steps a session may go unused before it is freed on the draft

DEFAULT_TIMEOUT_SECONDS = 0.5  # a vLLM step is tens of milliseconds: a late draft costs at most this, once
DEFAULT_CHECK_TIMEOUT_SECONDS = 5.0
DEFAULT_COOLDOWN_STEPS = 16
DEFAULT_IDLE_STEPS = 64


class ConfigError(ValueError):
    """A variable is missing or malformed; the message names it and what it accepts."""


@dataclass(frozen=True)
class ProposerConfig:
    drafts: list[str]  # this replica's drafts, first choice first (starsd.assignment.ordered_drafts); [] with source
    target_id: str
    tls_ca: Path | None
    gamma: int
    timeout: float
    check_timeout: float
    cooldown_steps: int
    idle_steps: int
    source: DnsSource | None = None  # dns:HOST:PORT: the drafts are found live (starsd.verifier.discovery)

    def describe(self) -> str:
        """Where the drafts are, for the logs."""
        return str(self.source) if self.source is not None else ",".join(self.drafts)


def _number(env: Mapping[str, str], name: str, default: float, low: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < low:
        raise ConfigError(f"{name}={raw!r}: must be a finite number >= {low:g}")
    return value


def _integer(env: Mapping[str, str], name: str, default: int, low: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.lstrip("-").isdigit():
        raise ConfigError(f"{name}={raw!r} is not a whole number")
    value = int(raw)
    if value < low:
        raise ConfigError(f"{name}={raw!r}: must be >= {low}")
    return value


def gamma_limit_error(num_speculative_tokens: int, max_gamma: int) -> str | None:
    """Why vLLM's ``num_speculative_tokens`` cannot be served by a draft accepting ``max_gamma``, or None."""
    if num_speculative_tokens > max_gamma:
        return (
            f"vLLM's num_speculative_tokens is {num_speculative_tokens} but the draft proposes at most {max_gamma} "
            f"tokens per request (its --max-gamma): lower num_speculative_tokens or {GAMMA}"
        )
    return None


def load_config(env: Mapping[str, str], num_speculative_tokens: int) -> ProposerConfig:
    """The configuration in ``env`` for a vLLM server speculating ``num_speculative_tokens`` per step."""
    raw = env.get(DRAFT, "")
    if not raw.strip():
        raise ConfigError(
            f"{DRAFT} is not set: give the StarSD draft as HOST:PORT (or a comma-separated list of the star's "
            "drafts, draft 0 first), as `starsd target --draft`, or dns:HOST:PORT to find them live"
        )
    source: DnsSource | None = None
    addresses: list[str] = []
    try:
        if raw.strip().startswith(DNS_SCHEME):
            source = parse_drafts_from(raw)
        else:
            addresses = parse_draft_addresses(raw)
    except DraftListError as exc:
        raise ConfigError(str(exc).replace("--draft", DRAFT, 1)) from None
    except DraftSourceError as exc:
        raise ConfigError(str(exc).replace("--drafts-from", DRAFT, 1)) from None
    target_id = env.get(TARGET_ID, "").strip() or socket.gethostname()
    tls_raw = env.get(TLS_CA, "").strip()
    tls_ca = Path(tls_raw) if tls_raw else None
    if tls_ca is not None and not tls_ca.is_file():
        raise ConfigError(f"{TLS_CA}={tls_raw}: no such file (a PEM CA bundle)")
    if not 1 <= num_speculative_tokens <= defaults.GAMMA_MAX:
        raise ConfigError(
            f"vLLM's num_speculative_tokens is {num_speculative_tokens}; StarSD drafts "
            f"{defaults.GAMMA_MIN}..{defaults.GAMMA_MAX} tokens per step"
        )
    gamma = _integer(env, GAMMA, num_speculative_tokens, defaults.GAMMA_MIN)
    if gamma > num_speculative_tokens:
        raise ConfigError(
            f"{GAMMA}={gamma} is more than vLLM's num_speculative_tokens ({num_speculative_tokens}); "
            "raise num_speculative_tokens in --speculative-config or lower it"
        )
    return ProposerConfig(
        drafts=ordered_drafts(target_id, addresses) if addresses else [],
        target_id=target_id,
        tls_ca=tls_ca,
        gamma=gamma,
        timeout=_number(env, TIMEOUT, DEFAULT_TIMEOUT_SECONDS, 0.001),
        check_timeout=_number(env, CHECK_TIMEOUT, DEFAULT_CHECK_TIMEOUT_SECONDS, 0.001),
        cooldown_steps=_integer(env, COOLDOWN_STEPS, DEFAULT_COOLDOWN_STEPS, 0),
        idle_steps=_integer(env, IDLE_STEPS, DEFAULT_IDLE_STEPS, 1),
        source=source,
    )
