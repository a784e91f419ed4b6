"""`starsd bench vllm` without vLLM: reading vLLM's client result, combining a pair's passes, the ratios the
integration is judged by, the client's command line, and the command's refusals. The run itself (real `vllm
serve` processes) is in tests/vllm/test_bench_vllm.py, under `make test-vllm`."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from starsd.bench.report import Machine, write_json
from starsd.bench.vllm_compare import (
    ClientPass,
    VllmCompareConfig,
    VllmCompareReport,
    VllmPoint,
    client_argv,
    combine,
    draft_side,
    ratios,
    variant_ratios,
)
from starsd.bench.vllm_fleet import VllmServer, prometheus_totals
from starsd.cli import main

# The fields `vllm bench serve --save-result` writes (vLLM 0.32), as a speculating server's pass reports them.
CLIENT_RESULT = {
    "duration": 10.0,
    "completed": 64,
    "failed": 0,
    "total_input_tokens": 2048,
    "total_output_tokens": 4096,
    "request_throughput": 6.4,
    "output_throughput": 409.6,
    "median_ttft_ms": 12.5,
    "median_tpot_ms": 2.25,
    "spec_decode_acceptance_rate": 78.0,
    "spec_decode_acceptance_length": 4.12,
    "spec_decode_num_drafts": 1000,
    "spec_decode_draft_tokens": 4000,
    "spec_decode_accepted_tokens": 3120,
}


def a_pass(throughput: float, drafted: int = 0, accepted: int = 0, steps: int = 0, failed: int = 0) -> ClientPass:
    return ClientPass(64 - failed, failed, 4096, throughput, 10.0, 2.0, drafted, accepted, steps)


def test_a_client_result_is_read_with_its_speculation_counts() -> None:
    p = ClientPass.from_client(CLIENT_RESULT)
    assert (p.completed, p.failed, p.output_tokens) == (64, 0, 4096)
    assert p.output_throughput == pytest.approx(409.6)
    assert (p.draft_tokens, p.accepted_tokens, p.drafts) == (4000, 3120, 1000)


def test_a_pass_without_speculation_counts_no_drafts() -> None:
    plain = {k: v for k, v in CLIENT_RESULT.items() if not k.startswith("spec_decode")}
    p = ClientPass.from_client(plain)
    assert (p.draft_tokens, p.accepted_tokens, p.drafts) == (0, 0, 0)
    assert combine("alone", 1, [p], 0).acceptance is None


def test_a_pair_sums_tokens_and_weighs_acceptance_by_drafted_tokens() -> None:
    point = combine("pair-shared", 16, [a_pass(300.0, 4000, 3000, 1000), a_pass(200.0, 1000, 500, 250, 2)], 1)
    assert point.output_throughput == pytest.approx(500.0)
    assert point.acceptance == pytest.approx(3500 / 5000)  # not the mean of 0.75 and 0.5
    assert point.acceptance_length == pytest.approx(1 + 3500 / 1250)
    assert (point.replicas, point.draft_models, point.failed) == (2, 1, 2)


def test_ratios_compare_within_one_concurrency_and_say_what_is_missing() -> None:
    points = [
        combine("draft-model", 1, [a_pass(250.0)], 1),
        combine("starsd", 1, [a_pass(200.0)], 1),
        combine("pair-own", 1, [a_pass(250.0), a_pass(250.0)], 2),
        combine("pair-shared", 1, [a_pass(240.0), a_pass(235.0)], 1),
        combine("starsd", 16, [a_pass(900.0)], 1),
    ]
    got = {(r.name, r.concurrency): r.value for r in ratios(points)}
    assert got[("starsd / draft-model", 1)] == pytest.approx(0.8)
    assert got[("pair-shared / pair-own", 1)] == pytest.approx(0.95)
    assert got[("starsd / alone", 1)] is None  # no alone setup measured
    assert got[("starsd / draft-model", 16)] is None


def variant_point(setup: str, concurrency: int, throughput: float, variant: str, round_: int) -> VllmPoint:
    return dataclasses.replace(combine(setup, concurrency, [a_pass(throughput)], 1), variant=variant, round=round_)


# Two variants, three rounds, one concurrency: the in-process draft drifts between rounds (400, 300, 500 tok/s).
VARIANT_POINTS = [
    variant_point(setup, 1, throughput, variant, r)
    for r, (own, a, b) in enumerate([(400.0, 360.0, 200.0), (300.0, 240.0, 330.0), (500.0, 300.0, 400.0)])
    for variant, starsd in (("--x=a", a), ("--x=b", b))
    for setup, throughput in (("draft-model", own), ("starsd", starsd))
]


def test_a_variant_is_judged_by_its_median_ratio_to_the_pass_just_before() -> None:
    got = {r.name: r for r in variant_ratios(VARIANT_POINTS)}
    assert set(got) == {"starsd / draft-model [--x=a]", "starsd / draft-model [--x=b]"}
    a, b = got["starsd / draft-model [--x=a]"], got["starsd / draft-model [--x=b]"]
    assert a.rounds == pytest.approx((0.9, 0.8, 0.6)) and a.value == pytest.approx(0.8)
    assert b.rounds == pytest.approx((0.5, 1.1, 0.8)) and b.value == pytest.approx(0.8)
    assert a.concurrency == b.concurrency == 1 and a.goal == 1.0


def test_a_variant_report_names_each_round_and_variant(tmp_path: Path) -> None:
    cfg = dataclasses.replace(config(tmp_path), variants=("--x=a", "--x=b"), rounds=3)
    report = VllmCompareReport(cfg, Machine.now().finished(), VARIANT_POINTS)
    assert [r.name for r in report.ratios] == ["starsd / draft-model [--x=a]", "starsd / draft-model [--x=b]"]
    text = report.table()
    assert "draft options" in text and "round" in text and "--x=b" in text
    assert "0.80x  >= 1x  (median of 0.90, 0.80, 0.60)" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("--max-batch=8", "needs two or more variants separated by ';'"),
        ("--max-batch=8;--turbo", "'--turbo': not options of `starsd draft`"),
        ("--max-batch=8;--max-batch='3", "No closing quotation"),
    ],
)
def test_bad_draft_variants_are_refused_before_anything_starts(
    value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "vllm", "--vllm-venv", str(tmp_path / "none"), f"--draft-variants={value}"]) == 2
    assert message in capsys.readouterr().err


def config(tmp_path: Path) -> VllmCompareConfig:
    return VllmCompareConfig(
        target=tmp_path / "target",
        draft=tmp_path / "draft",
        venv=tmp_path / "venv",
        concurrency=(1, 16),
        requests=64,
        input_len=32,
        output_len=64,
        gamma=4,
        start_seconds=600.0,
        log_dir=tmp_path,
    )


def test_the_client_runs_as_the_peer_figures_do(tmp_path: Path) -> None:
    server = VllmServer("alone", tmp_path / "target", tmp_path / "alone.log", port=8123)
    argv = client_argv(config(tmp_path), server, 16, tmp_path / "out" / "alone-c16.json")
    assert argv[:3] == [str(tmp_path / "venv" / "bin" / "vllm"), "bench", "serve"]
    flags = dict(itertools.pairwise(argv[3:]))
    assert flags["--base-url"] == "http://127.0.0.1:8123"
    assert flags["--max-concurrency"] == "16" and flags["--num-prompts"] == "64"
    assert flags["--random-input-len"] == "32" and flags["--random-output-len"] == "64"
    assert flags["--temperature"] == "0" and "--ignore-eos" in argv
    assert flags["--result-dir"] == str(tmp_path / "out") and flags["--result-filename"] == "alone-c16.json"


def test_the_report_prints_every_point_and_ratio_and_writes_json(tmp_path: Path) -> None:
    points = [combine("draft-model", 1, [a_pass(250.0, 400, 300, 100)], 1), combine("starsd", 1, [a_pass(200.0)], 1)]
    report = VllmCompareReport(config(tmp_path), Machine.now().finished(), points)
    text = report.table()
    assert "draft-model" in text and "250.0" in text and "0.750" in text
    assert "starsd / draft-model" in text and "0.80x" in text
    write_json(tmp_path / "vllm.json", report)
    data = json.loads((tmp_path / "vllm.json").read_text())
    assert data["benchmark"] == "vllm" and len(data["points"]) == 2
    assert data["ratios"][0] == {
        "name": "starsd / draft-model",
        "concurrency": 1,
        "value": 0.8,
        "goal": 1.0,
        "rounds": [],
    }


# The StarSD draft's /metrics (prometheus_client's text) before and after a pass of 530 one-row rounds.
DRAFT_BEFORE = """# HELP starsd_draft_requests_total Proposal requests answered
starsd_draft_requests_total 100.0
starsd_draft_ahead_hits_total 40.0
starsd_draft_service_seconds_bucket{le="0.004"} 90.0
starsd_draft_service_seconds_sum 0.5
starsd_draft_service_seconds_count 100.0
starsd_draft_transfer_seconds_sum 0.1
starsd_draft_transfer_seconds_count 99.0
starsd_draft_target_verify_seconds_sum 1.0
starsd_draft_target_verify_seconds_count 99.0
"""
DRAFT_AFTER = """starsd_draft_requests_total 630.0
starsd_draft_ahead_hits_total 358.0
starsd_draft_service_seconds_bucket{le="0.004"} 500.0
starsd_draft_service_seconds_sum 3.15
starsd_draft_service_seconds_count 630.0
starsd_draft_transfer_seconds_sum 0.6
starsd_draft_transfer_seconds_count 599.0
starsd_draft_target_verify_seconds_sum 6.5
starsd_draft_target_verify_seconds_count 599.0
"""


def test_the_draft_side_of_a_pass_is_what_its_counters_gained_during_it() -> None:
    side = draft_side(prometheus_totals(DRAFT_BEFORE), prometheus_totals(DRAFT_AFTER))
    assert side.requests == 530
    assert side.service_ms == pytest.approx(5.0)  # 2.65 s over 530 requests
    assert side.transfer_ms == pytest.approx(1.0)  # 0.5 s over 500 round trips
    assert side.verify_ms == pytest.approx(11.0)
    assert side.ahead_hits == pytest.approx(0.6)


def test_a_pass_the_draft_answered_nothing_in_has_no_means() -> None:
    totals = prometheus_totals(DRAFT_BEFORE)
    side = draft_side(totals, totals)
    assert side.requests == 0
    assert (side.service_ms, side.transfer_ms, side.verify_ms, side.ahead_hits) == (None, None, None, None)


def test_the_report_shows_the_draft_side_where_a_pass_has_one(tmp_path: Path) -> None:
    side = draft_side(prometheus_totals(DRAFT_BEFORE), prometheus_totals(DRAFT_AFTER))
    points = [
        combine("draft-model", 1, [a_pass(250.0, 400, 300, 100)], 1),
        dataclasses.replace(combine("starsd", 1, [a_pass(200.0)], 1), draft=side),
    ]
    report = VllmCompareReport(config(tmp_path), Machine.now().finished(), points)
    lines = report.table().splitlines()
    head = lines[0].split()
    assert head[-4:] == ["Tq", "Tc", "Tp", "ahead"]
    assert lines[1].split()[-4:] == ["-", "-", "-", "-"]  # the in-process draft's pass
    assert lines[2].split()[-4:] == ["5.00", "1.00", "11.00", "0.60"]
    write_json(tmp_path / "vllm.json", report)
    data = json.loads((tmp_path / "vllm.json").read_text())
    assert data["points"][0]["draft"] is None
    assert data["points"][1]["draft"]["service_ms"] == pytest.approx(5.0)


def test_prometheus_totals_sum_over_labels() -> None:
    text = '# HELP x\nvllm:a_total{pos="0"} 3\nvllm:a_total{pos="1"} 4.5\nvllm:b 1e3\n'
    assert prometheus_totals(text) == {"vllm:a_total": 7.5, "vllm:b": 1000.0}


def test_without_vllm_the_command_says_how_to_install_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "vllm", "--vllm-venv", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert f"no vLLM at {tmp_path / 'none' / 'bin' / 'vllm'}" in err and "make test-vllm" in err


def test_a_target_without_a_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "vllm").write_text("#!/bin/sh\n")
    code = main(["bench", "vllm", "--vllm-venv", str(tmp_path / "venv"), "--target", str(tmp_path / "nothing")])
    assert code == 2
    assert f"--target {tmp_path / 'nothing'} holds no checkpoint" in capsys.readouterr().err


def test_an_unknown_setup_is_refused_with_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "vllm", "--setups", "alone,turbo"])
    assert exit_.value.code == 2
    assert "expected setups among alone, draft-model, starsd, pair-own, pair-shared, got 'alone,turbo'" in (
        capsys.readouterr().err
    )
