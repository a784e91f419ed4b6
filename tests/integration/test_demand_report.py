"""A real target reports its demand to a real draft on its stream, and the draft's /v1/load shows it: the
operator's scale-out and scale-in signal, end to end over loopback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from starsd.local import LocalStar, http_json
from tests.integration.conftest import start_star

MAX_NUM_SEQS = 4


def test_running_completions_show_in_the_drafts_load(shipped_pair: tuple[Path, Path], tmp_path: Path) -> None:
    star: LocalStar = start_star(shipped_pair, 1, tmp_path, target_args=["--max-num-seqs", str(MAX_NUM_SEQS)])
    try:
        body = {"prompt": "def f(", "max_tokens": 160, "temperature": 0, "ignore_eos": True}
        results: list[int] = []
        workers = [
            threading.Thread(target=lambda: results.append(http_json(f"{star.urls[0]}/v1/completions", body)[0]))
            for _ in range(2)
        ]
        for w in workers:
            w.start()
        seen: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(w.is_alive() for w in workers):
            seen = http_json(star.load_url)[1]
            if seen["running_requests"] >= 2:
                break
            time.sleep(0.05)
        for w in workers:
            w.join(timeout=120)
        assert results == [200, 200]
        assert seen["running_requests"] == 2 and seen["waiting_requests"] == 0, seen
        assert seen["target_occupancy"] == 2 / MAX_NUM_SEQS, seen
    finally:
        star.stop()
