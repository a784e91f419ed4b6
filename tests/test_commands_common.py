"""The commands' shared helpers: options filled from the flags of the same names, the listen flags, and the
benchmarks' measure-and-publish and model flags."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from starsd.bench.report import Machine
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


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["target", "--port", "99999"], "argument --port: 99999 is not a TCP port (0..65535)"),
        (["draft", "--port", "abc"], "argument --port: 'abc' is not a port number"),
        (["draft", "--metrics-port", "-1"], "argument --metrics-port: -1 is not a TCP port (0..65535)"),
        (["operator", "--metrics-port", "70000"], "argument --metrics-port: 70000 is not a TCP port (0..65535)"),
        (["operator", "--liveness-port", "0"], "argument --liveness-port: 0 is not a port probes can reach"),
    ],
)
def test_a_port_out_of_range_is_refused_by_the_command_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a server took --port 99999 and died at bind() with a traceback."""
    from starsd.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and error in capsys.readouterr().err


def test_a_benchmark_run_that_fails_becomes_its_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    from starsd.commands.bench.common import measure_and_publish

    def measure() -> int:
        raise RuntimeError("the draft did not start")

    assert measure_and_publish("capacity", measure, lambda value, machine: Table(value, machine), None) == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "starsd bench capacity: the draft did not start\n")


def test_a_benchmark_report_is_printed_and_written_with_the_load_after_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from starsd.commands.bench.common import measure_and_publish

    path = tmp_path / "report.json"
    assert measure_and_publish("x", lambda: 3, lambda value, machine: Table(value, machine), path) == 0
    assert capsys.readouterr().out.splitlines()[0] == "value 3"
    written = json.loads(path.read_text())
    assert written["value"] == 3
    assert "loadavg_after" in written["machine"] and written["machine"]["time"] > 0


def test_a_model_flag_must_name_a_shape_or_a_directory(tmp_path: Path) -> None:
    from starsd.commands.bench.common import model_error

    assert model_error(argparse.Namespace(draft="llama-1b", target=str(tmp_path))) is None
    problem = model_error(argparse.Namespace(draft="llama-1b", target=str(tmp_path / "none")))
    assert problem is not None and problem.startswith(f"--target '{tmp_path / 'none'}' is neither a shape (")


@dataclass
class Table:
    value: int
    machine: Machine

    def table(self) -> str:
        return f"value {self.value}"
