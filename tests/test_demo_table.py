"""The demo's summary table: per-target figures that differ when the targets do, and a readable regime line."""

from __future__ import annotations

from starsd.demo import PhaseResult, TargetTotals, format_report, read_regime

LOAD = {
    "utilization": 0.97,
    "window_seconds": 10.0,
    "regime": "FullyLoaded",
    "tq_seconds": 0.004,
    "tp_seconds": 0.003,
    "tc_seconds": 0.0001,
    "recommended_targets": 2,
}


def totals(tokens: int, requests: int, seconds: float, drafted: int = 0, accepted: int = 0) -> TargetTotals:
    return TargetTotals(
        tokens=tokens, drafted=drafted, accepted=accepted, rounds=requests * 4, requests=requests, seconds=seconds
    )


def phases() -> tuple[PhaseResult, PhaseResult]:
    # Both targets produce the same tokens over the same wall time, but t1's requests take twice as long.
    star = PhaseResult(
        seconds=2.0,
        per_target={
            "t0": totals(640, 10, 5.0, drafted=400, accepted=330),
            "t1": totals(640, 10, 10.0, drafted=400, accepted=230),
        },
        outputs={0: [1, 2], 1: [3, 4]},
    )
    alone = PhaseResult(
        seconds=4.0,
        per_target={"t0": totals(640, 10, 12.8), "t1": totals(640, 10, 12.8)},
        outputs={0: [1, 2], 1: [3, 4]},
    )
    return star, alone


def row(report: str, name: str) -> list[str]:
    return next(line for line in report.splitlines() if line.startswith(name)).split()


def test_time_per_token_is_the_request_latency_over_its_tokens() -> None:
    t = totals(640, 10, 5.0)
    assert t.ms_per_request == 500.0
    assert t.ms_per_token == 5000.0 / 640
    assert TargetTotals().ms_per_token == 0.0 and TargetTotals().ms_per_request == 0.0


def test_rows_differ_when_the_targets_do() -> None:
    star, alone = phases()
    report = format_report(star, alone, LOAD, targets=2)
    t0, t1 = row(report, "t0"), row(report, "t1")
    # name, requests, ms/req, alone, ms/token, alone, speedup, accept rate, mean accepted, rounds, fallback
    assert t0[2:5] == ["500", "1280", "7.8"] and t1[2:5] == ["1000", "1280", "15.6"]
    assert t0[6] == "2.56x" and t1[6] == "1.28x"
    assert t0[7] == "0.82" and t1[7] == "0.57"
    assert "all 20 requests: 640.0 tokens/s with the draft, 320.0 alone (2.00x)" in report
    assert "lossless: 2/2" in report


def test_the_table_says_why_identical_targets_accept_differently() -> None:
    star, alone = phases()
    report = format_report(star, alone, LOAD, targets=2)
    assert "because their prompts differ" in report and "i mod 2" in report


def test_regime_line_is_read_for_the_run_target_count() -> None:
    full = read_regime(LOAD, targets=4)
    assert "FullyLoaded" in full and "N* = 2 already fill it" in full and "the other 2 wait" in full
    assert "the system model's, on the measured Tq, Tp and Tc" in full
    assert "N* = 2 is the fewest" in read_regime(LOAD, targets=2)
    under = read_regime({**LOAD, "regime": "UnderLoaded", "recommended_targets": 6}, targets=4)
    assert "UnderLoaded" in under and "room for 2 more" in under
    connected = read_regime({**LOAD, "regime": "UnderLoaded"}, targets=4)
    assert "connected" in connected and "room for" not in connected
    assert "no load" in read_regime({}, targets=4)
    assert read_regime(LOAD, targets=4) in format_report(*phases(), LOAD, targets=4)
