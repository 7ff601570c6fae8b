"""``qwenperf history`` and ``qwenperf history import`` as a user runs them (the installed command,
a real SQLite store), and the plugin's ``--qwenperf-history``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from pytest_qwenperf.gate.history_store import HistoryStore, SeriesKey, SeriesPoint
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
    assert "failing on a confirmed change for the worse: cpu/base / isl128-osl128 / output_throughput: the level is -16." in shown.stderr
    assert "from the last good level 5,000 tok/s (before the step at run #9, 2026-11-09, vLLM 0.31.0 → 0.32.0)" in shown.stderr
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = json.loads(qwenperf("history", store, "--metric", "output_throughput", "--json").stdout)
    (series,) = data["series"]
    assert data["schema"] == "qwenperf-history/1" and len(series["points"]) == 14
    (change,) = series["changes"]
    assert change["index"] == 8 and change["confirmed"] and change["direction"] == "worse" and series["failing"]

    markdown = qwenperf("history", store, "--metric", "output_throughput", "--markdown")
    assert markdown.returncode == 0  # without --fail-on, a change is reported, not failed on
    assert markdown.stdout.startswith("### cpu/base") and "| change at |" in markdown.stdout


@pytest.mark.parametrize(("after", "fails"), [(4_700.0, True), (5_000.0, False)])
def test_a_partial_recovery_fails_and_a_full_one_passes(tmp_path: Path, after: float, fails: bool) -> None:
    """-12 %, then a step back up: the latest change is for the better either way, but only the
    full recovery is back at the last good level."""
    store = tmp_path / "history.sqlite"
    sessions(tmp_path / "nights", [5_000.0] * 8 + [4_400.0] * 6 + [after] * 6)
    assert qwenperf("history", "import", store, tmp_path / "nights").returncode == 0
    shown = qwenperf("history", store, "--metric", "output_throughput", "--fail-on", "change")
    assert shown.returncode == (1 if fails else 0), shown.stdout + shown.stderr
    assert ("the level is -6.0% from the last good level 5,000 tok/s (before the step at run #9" in shown.stderr) is fails
    assert ("worse than its last good level" in shown.stdout) is fails
    (series,) = json.loads(qwenperf("history", store, "--metric", "output_throughput", "--json").stdout)["series"]
    assert series["failing"] is fails and (series["decline"] is not None) is fails


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
        (("history", "{tmp}/no/such/folder/h.sqlite"), "no/such/folder/h.sqlite: no history store there"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    done = qwenperf(*(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_reading_a_store_never_creates_one(tmp_path: Path) -> None:
    """A typo in the store's name was a new empty store and exit 0 under --fail-on change: a silent pass."""
    typo = tmp_path / "histroy.sqlite"
    done = qwenperf("history", typo, "--fail-on", "change")
    assert done.returncode == 2 and done.stderr.strip().endswith("no history store there (a command that reads a store never creates one)")
    assert len(done.stderr.strip().splitlines()) == 1 and not typo.exists()


def test_a_store_or_filter_with_no_series_is_no_pass(tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite"
    HistoryStore.open(store).close()  # a store, empty
    done = qwenperf("history", store, "--fail-on", "change")
    assert done.returncode == 2 and done.stderr.strip().endswith("history.sqlite: it holds no runs"), done.stderr
    sessions(tmp_path / "nights", [5_000.0] * 3)
    assert qwenperf("history", "import", store, tmp_path / "nights").returncode == 0
    done = qwenperf("history", store, "--config", "bsae", "--metric", "output_throughput", "--fail-on", "change")
    assert done.returncode == 2 and done.stderr.strip().endswith("match --config bsae, --metric output_throughput"), done.stderr


def test_a_file_that_is_not_a_store_gets_one_line_and_is_left_as_it_was(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database, " * 100)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE mine (x INTEGER)")
    before = {path: path.read_bytes() for path in (text, other)}
    for path, message in ((text, "cannot open the history store: file is not a database"), (other, "not a history store (no qwenperf_schema table)")):
        done = qwenperf("history", path, "--fail-on", "change")
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert {path: path.read_bytes() for path in (text, other)} == before


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


def test_a_session_records_in_the_default_store_unless_told_not_to(pytester: pytest.Pytester) -> None:
    """No option, no ini key: the runs go to .qwenperf/history.sqlite under the rootdir, in a folder
    git ignores; a session that measures nothing, or one with --qwenperf-no-history, makes no file."""
    write_suite(pytester.path)
    pytester.makepyfile(
        test_run="def test_run(qwenperf_run):\n    assert qwenperf_run.metrics['completed'] == 8\n",
        test_nothing="def test_nothing():\n    pass\n",
    )
    default = pytester.path / ".qwenperf" / "history.sqlite"
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        args = ("-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={source.urls[0]}")
        nothing = pytester.runpytest_subprocess(*args, "test_nothing.py")
        assert nothing.ret == pytest.ExitCode.OK and not default.parent.exists()
        off = pytester.runpytest_subprocess(*args, "--qwenperf-no-history", "test_run.py")
        assert off.ret == pytest.ExitCode.OK and not default.parent.exists(), off.stdout.str()
        recorded = pytester.runpytest_subprocess(*args, "test_run.py")
    assert recorded.ret == pytest.ExitCode.OK, recorded.stdout.str() + recorded.stderr.str()
    recorded.stdout.fnmatch_lines([f"*1 run(s) recorded in the history store {default}*"])
    assert (default.parent / ".gitignore").read_text().splitlines()[-1] == "*"
    with HistoryStore.open(default, create=False) as store:
        assert store.count() == 1
    both = pytester.runpytest_subprocess(*args, "--qwenperf-no-history", "--qwenperf-history=h.sqlite", "test_run.py")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--qwenperf-history and --qwenperf-no-history: choose one*"])


JUDGED = """
def test_judged(qwenperf_judgements):
    verdicts = sorted({j.verdict for j in qwenperf_judgements})
    print("REFERENCE", "; ".join(sorted({j.reference for j in qwenperf_judgements})) or "none", "VERDICTS", " ".join(verdicts))
"""


def test_the_second_session_is_judged_against_the_first_one_the_history_holds(pytester: pytest.Pytester) -> None:
    """No stored baseline: the first session judges nothing and says that its runs are now the
    reference; the second is judged against the first through the default history store."""
    write_suite(pytester.path)
    pytester.makepyfile(test_judged=JUDGED)
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        args = ("-p", "no:cacheprovider", "-s", "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={source.urls[0]}")
        first = pytester.runpytest_subprocess(*args)
        second = pytester.runpytest_subprocess(*args)
    assert first.ret == second.ret == pytest.ExitCode.OK, first.stdout.str() + second.stdout.str()
    first.stdout.fnmatch_lines(
        [
            "*REFERENCE none VERDICTS no-baseline",
            (
                "*1 of 1 point(s) had no stored baseline and no history to be judged against: this session's runs are now "
                "their reference on this machine, and the next session is judged against them"
            ),
        ]
    )
    second.stdout.re_match_lines([r".*REFERENCE history: 1 run, \d{4}-\d\d-\d\d, vLLM \S+ VERDICTS (?!.*no-baseline).+$"])
    second.stdout.re_match_lines([r".*out MDE +took \(plan\)  vs$", r"standin/base / w .*  history: 1 run, \d{4}-"])  # the session table
    assert "had no stored baseline" not in second.stdout.str()


def test_a_stored_baseline_wins_over_the_history(pytester: pytest.Pytester) -> None:
    """A session records into the history and its run becomes the stored baseline: the next session
    is judged against the file, not the history, and names it."""
    write_suite(pytester.path)
    pytester.makepyfile(test_judged=JUDGED)
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        args = ("-p", "no:cacheprovider", "-s", "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={source.urls[0]}")
        first = pytester.runpytest_subprocess(*args, "--qwenperf-update-baselines")
        second = pytester.runpytest_subprocess(*args)
    assert first.ret == second.ret == pytest.ExitCode.OK, first.stdout.str() + second.stdout.str()
    assert list((pytester.path / "baselines").glob("*/*/base/w.json"))
    second.stdout.re_match_lines([r".*REFERENCE stored baseline VERDICTS (?!.*no-baseline).+$"])
    with HistoryStore.open(pytester.path / ".qwenperf" / "history.sqlite", create=False) as store:
        assert store.count() == 2  # the history was kept, and passed over


def test_a_store_that_cannot_be_opened_fails_the_session_before_it_measures(pytester: pytest.Pytester) -> None:
    write_suite(pytester.path)
    pytester.makepyfile(test_run="def test_run(qwenperf_run):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--qwenperf-suite=suite.toml", "--qwenperf-history=missing/h.sqlite")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--qwenperf-history (or ini qwenperf_history): missing/h.sqlite: cannot open the history store*"])


def test_series_without_a_value_in_any_run_are_named_once_not_drawn() -> None:
    key = SeriesKey("cpu-x", "embedded:tiny", "cpu", "base", "isl128-osl128", "spec_decode_acceptance_rate")
    point = SeriesPoint("k", "2026-11-01T02:00:00+00:00", "2026-11-01T03:00:00+00:00", "0.32.0", (1.0, 1.1))
    with_values = Series(dataclasses.replace(key, metric="output_throughput"), (point,), (), tolerance=0.03)
    shown = render([Series(key, (), (), tolerance=0.03), with_values])
    assert "spec_decode_acceptance_rate (" not in shown and "output_throughput (" in shown
    assert shown.endswith("no value in any run (left out): spec_decode_acceptance_rate")
