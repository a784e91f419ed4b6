"""The commands' shared helpers: options dataclasses filled from the flags of the same names, the listen flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from starsd.commands._common import add_listen_args, from_flags


@dataclass(frozen=True)
class Limits:
    max_batch: int = 1
    schedule: str = "fifo"
    window: float = 10.0  # no flag names it


def test_from_flags_takes_the_flags_named_after_the_fields_and_leaves_the_rest_at_their_defaults() -> None:
    args = argparse.Namespace(max_batch=8, schedule="fair", log_level="DEBUG")
    assert from_flags(Limits, args) == Limits(max_batch=8, schedule="fair", window=10.0)


def test_from_flags_lets_given_values_override_a_flag() -> None:
    args = argparse.Namespace(max_batch=8, schedule="fair")
    assert from_flags(Limits, args, max_batch=2, window=1.0) == Limits(max_batch=2, schedule="fair", window=1.0)


def test_from_flags_rejects_a_given_value_for_no_field() -> None:
    with pytest.raises(TypeError):
        from_flags(Limits, argparse.Namespace(), nonsense=1)


def test_listen_flags_default_to_every_address_and_the_given_port() -> None:
    parser = argparse.ArgumentParser()
    add_listen_args(parser, "gRPC", 50051, "0 picks a free one")
    args = parser.parse_args([])
    assert (args.host, args.port) == ("0.0.0.0", 50051)
    assert parser.parse_args(["--port", "0", "--host", "127.0.0.1"]).port == 0
    assert "gRPC port; 0 picks a free one" in " ".join(parser.format_help().split())
