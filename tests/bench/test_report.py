"""Reports are typed records: the table and the JSON of a benchmark come from the same record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starsd.bench.capacity import CapacityPoint, CapacityReport, summarise_capacity
from starsd.bench.protocol import ProtocolReport, ProtocolResult
from starsd.bench.report import Column, Machine, table, to_json, write_json
from starsd.bench.serve import Percentiles, RequestRecord, ServeConfig, summarize


def test_columns_format_scale_and_dash_what_does_not_apply() -> None:
    rows = [{"name": "a", "seconds": 0.0123, "share": None}, {"name": "bb", "seconds": 1.5, "share": 0.25}]
    columns: list[Column[dict[str, object]]] = [
        Column("name", lambda r: r["name"], "", 5, left=True),
        Column("ms", lambda r: r["seconds"], ".2f", 9, scale=1e3),
        Column("share", lambda r: r["share"], ".1f", 7, scale=100, unit="%"),
    ]
    assert table(rows, columns) == [
        "name        ms  share",
        "a        12.30      -",
        "bb     1500.00  25.0%",
    ]


def test_percentiles_interpolate_between_order_statistics() -> None:
    p = Percentiles.of([float(x) for x in range(1, 101)])  # numpy's default ("linear"), as vLLM's bench reports
    assert (p.mean, p.p50) == (50.5, 50.5) and p.p90 == pytest.approx(90.1) and p.p99 == pytest.approx(99.01)
    assert Percentiles.of([]) == Percentiles()


def test_a_serve_pass_prints_and_writes_the_same_figures(tmp_path: Path) -> None:
    config = ServeConfig(urls=("http://x",), concurrency=2, requests=3)
    records = [
        RequestRecord(ok=True, ttft=0.010, e2e=0.110, output_tokens=11, prompt_tokens=32, drafted=8, accepted=6),
        RequestRecord(ok=True, ttft=0.020, e2e=0.220, output_tokens=11, prompt_tokens=32, drafted=8, accepted=2),
        RequestRecord(error="HTTP 429: busy"),
    ]
    result = summarize(config, records, wall=0.5)
    assert (result.completed, result.failed, result.errors) == (2, 1, ["HTTP 429: busy"])
    assert result.output_throughput == pytest.approx(44.0) and result.acceptance == pytest.approx(0.5)
    assert result.tpot_s.p99 == pytest.approx(0.0199)
    printed = result.table()
    assert "2 completions (1 failed) at concurrency 2" in printed and "acceptance 0.50" in printed
    ttft = next(line for line in printed.splitlines() if line.startswith("TTFT"))
    assert ttft.split()[1:] == ["15.0", "15.0", "19.0", "19.9"]  # ms: mean, p50, p90, p99
    data = to_json(result)
    assert data["config"]["urls"] == ("http://x",)
    assert data["ttft_s"] == pytest.approx({"mean": 0.015, "p50": 0.015, "p90": 0.019, "p99": 0.0199})
    out = tmp_path / "serve.json"
    write_json(out, result)
    assert json.loads(out.read_text())["output_throughput"] == pytest.approx(44.0)


def test_the_capacity_and_protocol_reports_keep_their_json_keys() -> None:
    machine = Machine(2, 0.0, [0.5, 0.4, 0.3], None)
    points = [CapacityPoint(1, 16, 4, 100, 2.0, 50.0, 140.0, 6.5, 1.0, 0.9, None, 1.0)]
    capacity = to_json(CapacityReport("models/draft", 512, 1, machine, summarise_capacity(points), points))
    assert list(capacity) == ["benchmark", "draft_model", "session_tokens", "repeats", "machine", "summary", "points"]
    assert capacity["benchmark"] == "capacity" and capacity["points"][0]["draft_cpu"] is None
    result = ProtocolResult("greedy", 4, 10, 0.5, 0.9, 1.2, 0.7, 60.0, 40.0, 100.0)
    report = ProtocolReport("models/draft", machine, [result])
    assert to_json(report)["results"][0]["bytes_per_round"] == 100.0
    head, row = report.table().splitlines()
    assert head.split()[:2] == ["mode", "gamma"]
    assert row.split() == ["greedy", "4", "0.500ms", "0.900ms", "1.200ms", "0.700ms", "100"]


def test_paths_in_a_report_are_written_as_text_and_other_objects_refused(tmp_path: Path) -> None:

    write_json(tmp_path / "r.json", {"model": tmp_path / "target"})
    assert json.loads((tmp_path / "r.json").read_text()) == {"model": str(tmp_path / "target")}
    with pytest.raises(TypeError, match="a report holds a object"):
        write_json(tmp_path / "bad.json", {"x": object()})
