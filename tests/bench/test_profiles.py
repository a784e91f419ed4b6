"""Accelerator profiles: the shipped table is valid, its derivations reproduce its numbers, user files load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from starsd import system_model
from starsd.bench import profiles


def _alpha_for(tokens_per_round: float, gamma: int) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if system_model.expected_tokens_per_round(gamma, alpha=mid) < tokens_per_round:
            lo = mid
        else:
            hi = mid
    return lo


def test_every_shipped_profile_is_valid_and_cites_its_source() -> None:
    assert profiles.DEFAULT_PROFILE in profiles.names()
    assert len(set(profiles.names())) == len(profiles.PROFILES) >= 3
    for p in profiles.PROFILES:
        assert p.kind in ("measured", "derived")
        assert len(p.source) > 40 and len(p.derivation) > 40
        assert system_model.optimal_targets(p.tq, p.tp, p.tc) >= 1
        text = profiles.describe(p)
        assert p.name in text and "source:" in text


def test_chen_et_al_profile_follows_from_the_paper_figures() -> None:
    p = profiles.get("tpuv4-chinchilla70b-4b")
    assert p.tq == pytest.approx(4 * 0.0018)
    # (Tq + Tp) per round at 7.52 ms per token (Table 1, XSum, K=4).
    assert p.alpha == pytest.approx(_alpha_for((p.tq + p.tp) / 0.00752, 4), abs=0.001)


def test_gpt_fast_profile_follows_from_the_readme_figures() -> None:
    p = profiles.get("a100-llama2-70b-int4_7b-int4")
    assert p.tq == pytest.approx(5 / 196.80)
    assert p.tp == pytest.approx(1 / 25.25)
    assert p.alpha == pytest.approx(_alpha_for(48.4 * (p.tq + p.tp), 5), abs=0.001)


def test_derived_h100_profile_is_memory_bound_so_batching_is_nearly_free() -> None:
    p = profiles.get("h100-llama3.1-70b-tp4_llama3.2-1b")
    curve = p.curve()
    assert curve is not None
    assert curve.tq(8) < 1.2 * curve.tq(1)  # 8 requests for < 20% more time
    assert curve.batching_gain() > 10
    assert system_model.batched_optimal_targets(curve, p.tp, p.tc) > 10 * system_model.optimal_targets(p.tq, p.tp, p.tc)
    # The same rule on an A100 lands within 5% of gpt-fast's measured 70B on 4 GPUs (38.01 tok/s).
    a100 = profiles.memory_bound_step(70.6e9 * 2 / 4, 0.0, 2039e9 * profiles.ACHIEVED_BANDWIDTH_FRACTION, 1)
    assert a100 == pytest.approx(1 / 38.01, rel=0.05)


def test_memory_bound_step_grows_with_kv_only() -> None:
    one = profiles.memory_bound_step(2e9, 1e6, 1e12, 1)
    eight = profiles.memory_bound_step(2e9, 1e6, 1e12, 8)
    assert eight - one == pytest.approx(7 * 1e6 / 1e12)
    with pytest.raises(ValueError):
        profiles.memory_bound_step(0, 1e6, 1e12, 1)


def test_user_profile_json_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "name": "mine",
                "gamma": 4,
                "tq": 0.004,
                "tp": 0.02,
                "tc": 0.0005,
                "alpha": 0.8,
                "batch_curve": [[1, 0.004], [8, 0.005]],
            }
        )
    )
    p = profiles.load_profile_json(path)
    assert (p.kind, p.tp1) == ("user", 0.02)
    assert p.curve() == system_model.BatchCurve(((1, 0.004), (8, 0.005)))
    assert profiles.profile_from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "JSON object"),
        (json.dumps({"name": "x", "gamma": 4, "tq": 0.004, "tp": 0.02, "tc": 0.0}), "alpha"),
        (
            json.dumps({"name": "x", "gamma": 4, "tq": 0.004, "tp": 0.02, "tc": 0.0, "alpha": 0.5, "tpp": 1}),
            "unknown profile fields: tpp",
        ),
        (json.dumps({"name": "x", "gamma": 4, "tq": -1, "tp": 0.02, "tc": 0.0, "alpha": 0.5}), "tq"),
        (
            json.dumps(
                {"name": "x", "gamma": 4, "tq": 0.004, "tp": 0.02, "tc": 0.0, "alpha": 0.5, "batch_curve": [[1, 0.005]]}
            ),
            "differs from tq",
        ),
        (
            json.dumps(
                {"name": "x", "gamma": 4, "tq": 0.004, "tp": 0.02, "tc": 0.0, "alpha": 0.5, "batch_curve": [1, 2]}
            ),
            "batch_curve",
        ),
    ],
)
def test_bad_profile_files_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        profiles.load_profile_json(path)


def test_a_profile_file_that_cannot_be_read_is_named_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=f"{missing}: cannot be read \\(No such file or directory\\)"):
        profiles.load_profile_json(missing)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=profiles.DEFAULT_PROFILE):
        profiles.get("nope")


def test_every_n_star_a_description_states_is_the_models() -> None:
    """The header's ``N*=`` and the derivation's ``N* = ...`` are both computed, so they agree; a hand-written
    ``N* is K`` in a source or derivation text would be a second, disagreeing copy."""
    for p in profiles.PROFILES:
        text = profiles.describe(p)
        expected = system_model.optimal_targets(p.tq, p.tp, p.tc)
        header = text.splitlines()[2]
        found = re.search(r"N\*=(\d+)", header)
        assert found is not None and found[1] == str(expected), p.name
        derivation = next(line for line in text.splitlines() if line.startswith("  derivation:"))
        assert derivation.endswith(f") = {expected}."), p.name
        assert not re.search(r"N\* is \d", p.derivation + p.source), p.name


def test_a_measured_profile_dropped_into_the_folder_is_listed_and_usable_by_name(tmp_path: Path) -> None:
    measured = dict(profiles.get("h100-llama3.1-70b-tp4_llama3.2-1b").to_dict(), name="gpu-measured", kind="measured")
    (tmp_path / "gpu.json").write_text(json.dumps(measured))
    found = profiles.measured_profiles(tmp_path)
    assert [p.name for p in found] == ["gpu-measured"] and found[0].curve() is not None
    unsourced = dict(measured, source="")
    (tmp_path / "gpu.json").write_text(json.dumps(unsourced))
    with pytest.raises(ValueError, match="needs kind 'measured' and a source"):
        profiles.measured_profiles(tmp_path)


def test_every_shipped_measured_profile_is_in_the_table() -> None:
    for p in profiles.measured_profiles():
        assert profiles.get(p.name) == p
