"""One choice of reference (:class:`~pytest_qwenperf.history.reference.References`): the stored
baseline, else the history store's window, else none; the same choice behind ``qwenperf compare
--baselines`` and ``qwenperf bisect``'s check of the good release. Real SQLite stores and files."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.cli.bisect import good_check
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.gate.baseline import BaselineError, baseline_from_run, save_baseline
from pytest_qwenperf.history.bisect import Bisection, Step
from pytest_qwenperf.history.bisect_report import render
from pytest_qwenperf.history.reference import References
from tests.test_compare import compare, session_file
from tests.test_history_reference import store_of
from tests.test_history_store import night


def baselines_of(tmp_path: Path, *runs: Run) -> Path:
    root = tmp_path / "baselines"
    for run in runs:
        save_baseline(root, baseline_from_run(run, source="test"))
    return root


def test_the_stored_baseline_wins_then_the_history_then_nothing(tmp_path: Path) -> None:
    history = str(store_of(tmp_path / "h", [night(day, 4_000.0) for day in range(1, 6)]))
    stored = baselines_of(tmp_path, night(1, 5_000.0))
    now = night(20, 5_000.0)
    found = References(stored, history).of(now)
    assert found is not None and found.metrics["output_throughput"].samples[1] == 5_000.0
    from_history = References(tmp_path / "none", history, window=2).of(now)
    assert from_history is not None and from_history.name == "history: 2 runs, 2026-11-04 → 05, vLLM 0.32.0"
    assert References(tmp_path / "none").of(now) is None
    assert References(tmp_path / "none", history).of(night(20, 5_000.0, config="ctx-short")) is None  # no run of its config


def test_a_store_that_cannot_be_read_is_an_error_not_an_absent_reference(tmp_path: Path) -> None:
    junk = tmp_path / "history.sqlite"
    junk.write_text("not a database, " * 100)
    with pytest.raises(BaselineError, match="the history"):
        References(tmp_path / "none", str(junk)).of(night(20, 5_000.0))


def test_compare_with_baselines_judges_each_file_against_its_own_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored = baselines_of(tmp_path, night(1, 5_000.0))
    history = store_of(tmp_path / "h", [night(day, 4_000.0, config="ctx-short") for day in range(1, 6)])
    slow = night(20, 4_000.0)  # 20 % below its stored baseline
    steady = night(20, 4_000.0, config="ctx-short")  # as its history
    night_file = session_file(tmp_path / "night.json", [msgspec.to_builtins(slow), msgspec.to_builtins(steady)])

    status, out, err = compare(capsys, night_file, "--baselines", stored, "--history", history, "--fail-on", "regression")
    assert status == 1, err
    assert "failing on 1 regression" in err
    base, short = out.split(f"{night_file}: ")[1:]
    assert base.splitlines()[:2] == ["base x isl128-osl128", "vs stored baseline"]
    assert "output_throughput: regression" in base
    assert short.splitlines()[:2] == ["ctx-short x isl128-osl128", "vs history: 5 runs, 2026-11-01 → 05, vLLM 0.32.0"]
    assert "regression" not in short

    status, out, _ = compare(capsys, night_file, "--baselines", stored, "--json")
    assert status == 0
    document = json.loads(out)
    assert document["schema"] == "qwenperf-compare-references/1"
    verdicts = {(p["config"], j["metric"]): j["verdict"] for p in document["points"] for j in p["judgements"]}
    assert verdicts[("base", "output_throughput")] == "regression"
    assert verdicts[("ctx-short", "output_throughput")] == "no-baseline"  # no --history: nothing for it
    assert [p["reference"] is None for p in document["points"]] == [False, True]


def test_compare_reads_a_history_only_with_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    night_file = session_file(tmp_path / "night.json", [msgspec.to_builtins(night(20, 4_000.0))])
    status, _, err = compare(capsys, night_file, night_file, "--history", tmp_path / "h.sqlite")
    assert status == 2 and "--history is read with --baselines" in err
    assert not (tmp_path / "h.sqlite").exists()


def test_bisect_names_a_good_release_that_is_slow_against_its_reference(tmp_path: Path) -> None:
    stored = baselines_of(tmp_path, night(1, 5_000.0))
    line, slow = good_check(References(stored), "0.31.0", night(20, 4_000.0))
    assert slow and line == "the good release against its reference (stored baseline): output_throughput: regression"
    line, slow = good_check(References(stored), "0.31.0", night(20, 5_000.0))
    assert not slow and line.endswith("within tolerance")
    line, slow = good_check(References(tmp_path / "none"), "0.31.0", night(20, 5_000.0))
    assert not slow and line == f"the good release has no reference in {tmp_path / 'none'}"

    steps = (Step("0.31.0", False, "pass", table="t", good_check="the good release against its reference (x): regression", good_slow=True),)
    shown = render(Bisection(("0.30.0", "0.31.0"), steps, None, "0.31.0"), "title")
    assert "the good release 0.30.0 was itself slower than its reference at step(s) 1" in shown
    assert "the good release against its reference (x): regression" in shown
