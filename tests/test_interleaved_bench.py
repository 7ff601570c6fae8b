"""benchmarks/interleaved.py's pure parts: the suite copy it runs, and its analysis of sessions."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import interleaved
from pytest_qwenperf.suite.config import load_suite


def test_the_suite_copy_changes_the_throughput_tolerances_alone(tmp_path: Path) -> None:
    path = tmp_path / "cpu.toml"
    path.write_text(interleaved.suite_text(0.07))
    copy, original = load_suite(path), load_suite(interleaved.SUITE)
    assert {name: copy.tolerances[name] for name in interleaved.TOLERANCED} == dict.fromkeys(interleaved.TOLERANCED, 0.07)
    assert {k: v for k, v in copy.tolerances.items() if k not in interleaved.TOLERANCED} == {
        k: v for k, v in original.tolerances.items() if k not in interleaved.TOLERANCED
    }
    assert [c.id for c in copy.configs] == [c.id for c in original.configs]
    assert copy.identity("base", "isl128-osl128", hardware="h") == original.identity("base", "isl128-osl128", hardware="h")


def side(throughputs: list[float]) -> dict[str, Any]:
    return {
        "samples": {
            "output_throughput": throughputs,
            "tokens_per_server_cpu_s": [1000.0 for _ in throughputs],
            "p99_tpot_ms": [1e5 / t for t in throughputs],
        },
        "extra_repeats": len(throughputs) - 3,
    }


def session(arm: str, ref: list[float], cand: list[float]) -> dict[str, Any]:
    return {"arm": arm, "exit_status": 0, "wall_s": 200.0, "reference": side(ref), "candidate": side(cand)}


def test_analysis_counts_verdicts_per_arm_and_compares_the_spreads_between_and_within_sessions() -> None:
    results = {
        "tolerance": 0.05,
        "repeats": 3,
        "max_repeats": 6,
        "sessions": [
            session("AA", [1000, 1010, 990], [1005, 995, 1000]),
            session("B", [1000, 1010, 990], [800, 808, 792]),
            session("AA", [1000, 1010, 990], [1100, 1111, 1089]),  # a second boot 10 % apart
            {"arm": "B", "exit_status": 1, "wall_s": 30.0, "output_tail": "boot failed"},
        ],
    }
    analysis = interleaved.analyse(results)
    assert analysis["complete"] == 3 and analysis["sessions"] == 4
    aa, b = (analysis["arms"][arm]["metrics"]["output_throughput"] for arm in ("AA", "B"))
    assert b["verdicts"] == {"regression": 1}
    assert b["median_ratio"] == pytest.approx(0.8)
    assert aa["verdicts"] == {"improvement": 1, "pass": 1}
    assert aa["between_sessions_log_sd"] == pytest.approx(abs(math.log(1.1) - math.log(1000 / 1000)) / math.sqrt(2), rel=0.05)
    assert aa["expected_log_sd"] < aa["between_sessions_log_sd"] / 5
    assert analysis["arms"]["AA"]["extra_repeats"] == [0, 0]


def test_skipping_the_first_repeats_leaves_them_out_of_every_judgement() -> None:
    slow_start = session("AA", [700, 1000, 1010, 990], [1300, 1005, 995, 1000])  # the first pair after boot is off
    results = {"tolerance": 0.05, "repeats": 3, "max_repeats": 6, "sessions": [slow_start]}
    whole = interleaved.analyse(results)["arms"]["AA"]["metrics"]["output_throughput"]["sessions"][0]
    skipped = interleaved.analyse(results, skip=1)["arms"]["AA"]["metrics"]["output_throughput"]["sessions"][0]
    assert skipped["repeats"] == 3 and whole["repeats"] == 4
    assert skipped["ratio"] == pytest.approx(1.0, abs=0.01) and whole["ratio"] > 1.05
    assert skipped["mde"] < whole["mde"]
