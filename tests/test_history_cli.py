"""``qwenperf history`` and ``qwenperf history import`` as a user runs them (the installed command,
a real SQLite store), and the plugin's ``--qwenperf-history``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_qwenperf.gate.history import HistoryStore, Point, SeriesKey
from pytest_qwenperf.history.report import Series, render
from pytest_qwenperf.measure.report import SessionReport
from tests.stream_source import stream_source
from tests.test_history_store import night
from tests.test_max_repeats import write_suite

QWENPERF = shutil.which("qwenperf") or str(Path(__file__).parents[1] / ".venv" / "bin" / "qwenperf")


def qwenperf(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QWENPERF, *map(str, args)], capture_output=True, text=True, check=False, timeout=120)


def sessions(folder: Path, levels: list[float]) -> list[Path]:
    """One session file a night, its base run's output throughput at ``levels[night]``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for day, level in enumerate(levels, start=1):
        report = SessionReport()
        report.add(night(day, level, version="0.31.0" if level > 4_600 else "0.32.0"))
        paths.append(folder / f"night-{day:02d}.json")
        report.write_json(paths[-1])
    return paths


def test_import_then_show_finds_the_step_and_fails_on_it(tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite"
    sessions(tmp_path / "nights", [5_000.0] * 8 + [4_200.0] * 6)
    imported = qwenperf("history", "import", store, tmp_path / "nights")
    assert imported.returncode == 0, imported.stderr
    assert "14 run(s) recorded" in imported.stdout
    again = qwenperf("history", "import", store, tmp_path / "nights")
    assert "0 run(s) recorded" in again.stdout and "14 already there" in again.stdout

    shown = qwenperf("history", store, "--config", "base", "--metric", "output_throughput", "--fail-on", "change", "--plot", tmp_path / "h.png")
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "cpu/base / isl128-osl128 / output_throughput (tok/s, higher is better)" in shown.stdout
    assert "0.31.0 → 0.32.0" in shown.stdout and "worse" in shown.stdout
    assert "failing on a confirmed change for the worse in cpu/base / isl128-osl128 / output_throughput" in shown.stderr
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = json.loads(qwenperf("history", store, "--metric", "output_throughput", "--json").stdout)
    (series,) = data["series"]
    assert data["schema"] == "qwenperf-history/1" and len(series["points"]) == 14
    (change,) = series["changes"]
    assert change["index"] == 8 and change["confirmed"] and change["direction"] == "worse" and series["failing"]

    markdown = qwenperf("history", store, "--metric", "output_throughput", "--markdown")
    assert markdown.returncode == 0  # without --fail-on, a change is reported, not failed on
    assert markdown.stdout.startswith("### cpu/base") and "| change at |" in markdown.stdout


def test_a_flat_history_passes_fail_on_change(tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite"
    sessions(tmp_path / "nights", [5_000.0] * 12)
    assert qwenperf("history", "import", store, *sorted((tmp_path / "nights").iterdir())).returncode == 0
    shown = qwenperf("history", store, "--metric", "output_throughput", "--fail-on", "change")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "no change point" in shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("history", "import", "{tmp}/h.sqlite"), "history import: expected at least one FILE or folder after STORE"),
        (("history", "import", "{tmp}/h.sqlite", "{tmp}/absent.json"), "absent.json: no such file or folder"),
        (("history", "{tmp}/h.sqlite", "stray.json"), "unexpected arguments ['stray.json'] (did you mean 'history import'?)"),
        (("history", "{tmp}/no/such/folder/h.sqlite"), "no/such/folder/h.sqlite: cannot open the history store"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    done = qwenperf(*(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_session_records_its_runs_in_the_store_named_by_the_ini_key(pytester: pytest.Pytester) -> None:
    write_suite(pytester.path)
    pytester.makeini("[pytest]\nqwenperf_history = stores/history.sqlite\n")
    (pytester.path / "stores").mkdir()
    pytester.makepyfile(test_run="def test_run(qwenperf_run):\n    assert qwenperf_run.metrics['completed'] == 8\n")
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        args = ("-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={source.urls[0]}")
        first = pytester.runpytest_subprocess(*args)
        second = pytester.runpytest_subprocess(*args)
    for result in (first, second):
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
        result.stdout.fnmatch_lines([f"*1 run(s) recorded in the history store {pytester.path / 'stores' / 'history.sqlite'}*"])
    with HistoryStore.open(pytester.path / "stores" / "history.sqlite") as store:
        assert store.count() == 2
        (key,) = store.keys(config="standin/base", metric="output_throughput")
        assert [len(p.values) for p in store.series(key)] == [2, 2]


def test_a_store_that_cannot_be_opened_fails_the_session_before_it_measures(pytester: pytest.Pytester) -> None:
    write_suite(pytester.path)
    pytester.makepyfile(test_run="def test_run(qwenperf_run):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", "--qwenperf-history=missing/h.sqlite")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--qwenperf-history (or ini qwenperf_history): missing/h.sqlite: cannot open the history store*"])


def test_series_without_a_value_in_any_run_are_named_once_not_drawn() -> None:
    key = SeriesKey("cpu-x", "embedded:tiny", "cpu", "base", "isl128-osl128", "spec_decode_acceptance_rate")
    point = Point("k", "2026-11-01T02:00:00+00:00", "2026-11-01T03:00:00+00:00", "0.32.0", (1.0, 1.1))
    with_values = Series(dataclasses.replace(key, metric="output_throughput"), (point,), ())
    shown = render([Series(key, (), ()), with_values])
    assert "spec_decode_acceptance_rate (" not in shown and "output_throughput (" in shown
    assert shown.endswith("no value in any run (left out): spec_decode_acceptance_rate")
