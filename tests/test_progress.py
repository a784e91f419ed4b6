"""Progress shows as plain lines when its stream is not a terminal (a log), and as nothing when disabled."""

from __future__ import annotations

import io

from starsd.progress import PlainProgress, progress


def test_a_redirected_stream_gets_one_line_per_tenth_and_no_carriage_returns() -> None:
    out = io.StringIO()
    with progress(50, "training", unit="step", stream=out) as bar:
        assert isinstance(bar, PlainProgress)
        for i in range(50):
            bar.update()
            bar.set_postfix(loss=f"{1 / (i + 1):.2f}")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 10 and lines[-1].startswith("training: 50/50 steps")
    assert lines[-1].endswith("loss=0.02")


def test_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    bar = progress(5, "x", stream=out, enabled=False)
    for _ in range(5):
        bar.update()
    assert out.getvalue() == ""
