"""The vLLM proposer's configuration from environment variables: defaults, and a clear error per bad value."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from starsd.integrations.vllm.config import (
    DEFAULT_IDLE_STEPS,
    DEFAULT_TIMEOUT_SECONDS,
    ConfigError,
    gamma_limit_error,
    load_config,
)


def test_defaults_follow_vllms_num_speculative_tokens() -> None:
    config = load_config({"STARSD_DRAFT": "127.0.0.1:50051", "STARSD_TARGET_ID": "vllm-0"}, 4)
    assert config.drafts == ["127.0.0.1:50051"]
    assert config.target_id == "vllm-0"
    assert config.gamma == 4
    assert config.timeout == DEFAULT_TIMEOUT_SECONDS
    assert config.idle_steps == DEFAULT_IDLE_STEPS
    assert config.tls_ca is None


def test_several_drafts_are_ordered_by_the_replicas_ordinal() -> None:
    env = {"STARSD_DRAFT": "d0:1,d1:1", "STARSD_TARGET_ID": "vllm-1"}
    assert load_config(env, 4).drafts == ["d1:1", "d0:1"]
    assert load_config({**env, "STARSD_TARGET_ID": "vllm-0"}, 4).drafts == ["d0:1", "d1:1"]


def test_dns_names_the_drafts_found_live() -> None:
    """A StarSDCluster's vLLM pool is given the drafts' headless Service, as its StarSD targets are."""
    config = load_config({"STARSD_DRAFT": "dns:chat-draft-pods.ml.svc:50051", "STARSD_TARGET_ID": "chat-v-0"}, 4)
    assert config.source is not None and (config.source.host, config.source.port) == ("chat-draft-pods.ml.svc", 50051)
    assert config.drafts == []
    assert config.describe() == "dns:chat-draft-pods.ml.svc:50051"
    static = load_config({"STARSD_DRAFT": "d0:1,d1:1"}, 4)
    assert static.source is None and static.describe() == ",".join(static.drafts)


def test_unix_sockets_are_addresses() -> None:
    assert load_config({"STARSD_DRAFT": "unix:/tmp/draft.sock"}, 2).drafts == ["unix:/tmp/draft.sock"]


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "STARSD_DRAFT is not set"),
        ({"STARSD_DRAFT": "   "}, "STARSD_DRAFT is not set"),
        ({"STARSD_DRAFT": "localhost"}, "STARSD_DRAFT 'localhost': entry 1 ('localhost') has no port"),
        ({"STARSD_DRAFT": "a:1,,b:2"}, "is empty"),
        ({"STARSD_DRAFT": "dns:chat-draft-pods.ml.svc"}, "STARSD_DRAFT 'dns:chat-draft-pods.ml.svc' has no port"),
        ({"STARSD_DRAFT": "dns:a:1,b:1"}, "is not one DNS name"),
        ({"STARSD_DRAFT": "a:1", "STARSD_GAMMA": "5"}, "STARSD_GAMMA=5 is more than vLLM's num_speculative_tokens"),
        ({"STARSD_DRAFT": "a:1", "STARSD_GAMMA": "0"}, "STARSD_GAMMA='0': must be >= 1"),
        ({"STARSD_DRAFT": "a:1", "STARSD_GAMMA": "two"}, "STARSD_GAMMA='two' is not a whole number"),
        ({"STARSD_DRAFT": "a:1", "STARSD_DRAFT_TIMEOUT": "soon"}, "STARSD_DRAFT_TIMEOUT='soon' is not a number"),
        ({"STARSD_DRAFT": "a:1", "STARSD_DRAFT_TIMEOUT": "-1"}, "must be a finite number >= 0.001"),
        ({"STARSD_DRAFT": "a:1", "STARSD_DRAFT_TIMEOUT": "nan"}, "must be a finite number"),
        ({"STARSD_DRAFT": "a:1", "STARSD_SESSION_IDLE_STEPS": "0"}, "STARSD_SESSION_IDLE_STEPS='0': must be >= 1"),
        ({"STARSD_DRAFT": "a:1", "STARSD_DRAFT_TLS_CA": "/nonexistent/ca.pem"}, "no such file (a PEM CA bundle)"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env, 4)
    assert words in str(info.value)


def test_num_speculative_tokens_outside_starsds_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_speculative_tokens is 17"):
        load_config({"STARSD_DRAFT": "a:1"}, 17)


def test_tls_ca_file_is_kept(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert load_config({"STARSD_DRAFT": "a:1", "STARSD_DRAFT_TLS_CA": str(ca)}, 4).tls_ca == ca


def test_gamma_beyond_the_drafts_limit_is_explained() -> None:
    assert gamma_limit_error(4, 16) is None
    problem = gamma_limit_error(8, 4)
    assert problem is not None and "at most 4" in problem and "STARSD_GAMMA" in problem


def test_throttle_logs_one_line_per_interval_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    from starsd.integrations.vllm.proposer import Throttle

    throttle = Throttle(interval=3600.0)
    with caplog.at_level("WARNING", logger="starsd.vllm"):
        assert throttle(logging.WARNING, "refused: %s", "full")
        assert not throttle(logging.WARNING, "refused: %s", "full")
        assert not throttle(logging.WARNING, "refused: %s", "full")
    assert [r.getMessage() for r in caplog.records] == ["refused: full"]
    assert throttle.held == 2
    throttle.next_at = 0.0  # the interval is over
    with caplog.at_level("WARNING", logger="starsd.vllm"):
        assert throttle(logging.WARNING, "refused: %s", "full")
    assert caplog.records[-1].getMessage() == "refused: full (2 more like it in the last 3600 s)"
