"""The command line's manners: ``--version``, ``--help`` without ``(default: None)``, a closed pipe."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from starsd import __version__, cli

STARSD = [sys.executable, "-m", "starsd.cli"]


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"starsd {__version__}"


@pytest.mark.parametrize(
    "argv",
    [("plan",), ("target",), ("draft",), ("operator",), ("bench", "star"), ("bench", "gamma"), ("models", "train")],
)
def test_help_never_says_default_none_nor_a_default_twice(capsys: pytest.CaptureFixture[str], argv: tuple) -> None:
    text = " ".join(help_text(capsys, *argv).split())  # argparse wraps lines: join them back
    assert "(default: None)" not in text
    assert "(default: False)" not in text
    for option in re.split(r"\s(?=--[a-z])", text):
        assert option.count("(default") <= 1, option


def test_target_help_gives_the_defaults_its_options_use(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(help_text(capsys, "target").split()).split(" options: ", 1)[1]  # past the usage lines
    args = cli.build_parser(["target"]).parse_args(["target", "--model", "m"])
    for option in ("--draft-timeout", "--draft-check-timeout", "--max-concurrency", "--max-tokens-cap"):
        value = getattr(args, option[2:].replace("-", "_"))
        described = re.search(rf"{option} \S+ (.*?)(?= --[a-z]|$)", text)
        assert described is not None, option
        assert re.search(rf"\(default:? {re.escape(str(value))}\b", described[1]), (option, described[1])


def test_formatter_adds_a_default_only_where_one_is_worth_saying() -> None:
    import argparse

    parser = argparse.ArgumentParser(formatter_class=cli.HelpFormatter)
    parser.add_argument("--size", type=int, default=3, help="how many")
    parser.add_argument("--name", help="a name")
    parser.add_argument("--fast", action="store_true", help="go fast")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    text = " ".join(parser.format_help().split())
    assert "how many (default: 3)" in text
    assert "a name --fast" in text  # nothing added after "a name"
    assert "go fast" in text and "go fast (default" not in text
    assert "port (default 8000)" in text and "8000) (default" not in text


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """``starsd plan --json | head -1``: the JSON is far larger than a pipe's buffer, so the write fails."""
    ns = ",".join(str(n) for n in range(1, 3001))
    argv = [*STARSD, "plan", "--tq", "0.004", "--tp", "0.03", "--tc", "0.001", "--alpha", "0.7", "--gamma", "4"]
    proc = subprocess.Popen([*argv, "--json", "--n", ns], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == b"{"
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == cli.EXIT_BROKEN_PIPE, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert stderr == ""


def test_local_makes_a_log_dir_that_does_not_exist_yet(tmp_path: Path) -> None:
    """`starsd local --log-dir logs/run-1` on a fresh checkout: the folder is made, not a FileNotFoundError."""
    from starsd.local import LocalStar

    wanted = tmp_path / "logs" / "run-1"
    star = LocalStar(targets=1, log_dir=wanted)
    assert star.log_dir == wanted and wanted.is_dir()


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        ("--draft-timeout", "-1", "--draft-timeout must be > 0, got -1.0"),
        ("--draft-timeout", "nan", "--draft-timeout must be > 0, got nan"),
        ("--draft-check-timeout", "0", "--draft-check-timeout must be > 0, got 0.0"),
        ("--draft-probe-interval", "0", "--draft-probe-interval must be > 0, got 0.0"),
        ("--max-body-bytes", "-5", "--max-body-bytes and --top-k must be >= 1, got -5 and"),
        ("--top-k", "0", "--max-body-bytes and --top-k must be >= 1, got"),
    ],
)
def test_a_target_refuses_a_limit_that_could_only_break_it_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, error: str
) -> None:
    """A draft timeout of -1 made every round decode alone, a body limit of -5 refused every request: each is
    refused at start with the flag's name (before the model is read: the path given does not exist)."""
    argv = ["target", "--model", str(tmp_path / "never-read"), "--port", "0", "--draft", "127.0.0.1:1"]
    assert cli.main([*argv, flag, value]) == 2
    assert error in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--idle-timeout", "-1"], "--idle-timeout must be > 0, got -1.0"),
        (["--tls-cert", "/no/cert.pem", "--tls-key", "/no/key.pem"], "--tls-cert /no/cert.pem: no such file (PEM)"),
    ],
)
def test_a_draft_refuses_a_bad_setting_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], error: str
) -> None:
    """Before, a missing TLS file was found only after the model had loaded, and named no flag."""
    argv = ["draft", "--model", str(tmp_path / "never-read"), "--port", "0", "--metrics-port", "0"]
    assert cli.main([*argv, *extra]) == 2
    assert error in capsys.readouterr().err
