"""The history store on real databases: an SQLite file, and a PostgreSQL server started by the
tests (tests/postgres.py); every behaviour that does not depend on the backend is run on both,
with the same assertions, so both give the same answers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.gate import history_store
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore, SeriesKey
from tests.test_baseline import make_run, run_of


def night(day: int, output: float, *, config: str = "base", version: str = "0.32.0", repeats: int = 3) -> Run:
    """A run of the cpu suite that started on November ``day``, its output throughput's repeats around ``output``."""
    data = make_run(config, output=output, version=version, samples={"output_throughput": [output * (1 + 0.01 * (i - 1)) for i in range(repeats)]})
    data["context"]["started"] = f"2026-11-{day:02d}T02:00:00+00:00"
    return run_of(data)


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh store lives: an SQLite file, or a new database on the tests' PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.sqlite")
    server = request.getfixturevalue("postgres_server")
    return server.new_database()


def output_key(config: str = "base") -> SeriesKey:
    run = night(1, 1.0, config=config)
    identity = run.identity.baseline()
    return SeriesKey(identity.hardware, identity.model, identity.suite, identity.config, identity.workload, "output_throughput")


def test_appended_runs_come_back_as_series_in_the_order_they_started(where: str) -> None:
    with HistoryStore.open(where) as store:
        assert store.version == history_store.VERSION and store.count() == 0
        assert store.append([night(3, 5_000.0), night(1, 5_200.0, version="0.31.0")], source="test") == 2
        assert store.append([night(2, 5_100.0, version="0.31.0")], source="test") == 1
        points = store.series(output_key())
        assert [p.started[:10] for p in points if p.started] == ["2026-11-01", "2026-11-02", "2026-11-03"]
        assert [p.vllm_version for p in points] == ["0.31.0", "0.31.0", "0.32.0"]
        assert points[0].values == pytest.approx((5_148.0, 5_200.0, 5_252.0))
        assert store.run(points[2].run_key) == night(3, 5_000.0)


def test_the_same_run_twice_is_recorded_once(where: str) -> None:
    with HistoryStore.open(where) as store:
        assert store.append([night(1, 5_000.0)], source="session") == 1
        assert store.append([night(1, 5_000.0), night(2, 5_000.0)], source="import") == 1
        assert store.count() == 2


def test_keys_list_each_series_and_filter_by_config_workload_and_metric(where: str) -> None:
    with HistoryStore.open(where) as store:
        store.append([night(1, 5_000.0), night(1, 4_000.0, config="ctx-short")], source="test")
        every = store.keys()
        assert {(k.config, k.metric) for k in every} >= {("base", "output_throughput"), ("ctx-short", "p99_tpot_ms")}
        assert store.keys(config="cpu/ctx-short", metric="output_throughput") == [output_key("ctx-short")]
        assert store.keys(config="ctx-short", metric="output_throughput") == [output_key("ctx-short")]
        assert store.keys(workload="no-such-workload") == []


def test_a_store_reopened_keeps_its_runs_and_is_not_migrated_again(where: str) -> None:
    with HistoryStore.open(where) as store:
        store.append([night(1, 5_000.0)], source="test")
    with HistoryStore.open(where) as store:
        assert store.count() == 1 and store.version == history_store.VERSION


def test_an_older_store_is_migrated_in_place_and_keeps_its_runs(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with HistoryStore.open(where) as store:
        store.append([night(1, 5_000.0)], source="test")
    later = (*history_store.MIGRATIONS, ("ALTER TABLE runs ADD COLUMN vllm_commit TEXT",))
    monkeypatch.setattr(history_store, "MIGRATIONS", later)
    monkeypatch.setattr(history_store, "VERSION", len(later))
    with HistoryStore.open(where) as store:
        assert store.version == len(later) and store.count() == 1
        store.append([night(2, 5_000.0)], source="test")
        assert len(store.series(output_key())) == 2


def test_a_store_of_a_newer_schema_is_refused_and_left_alone(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with HistoryStore.open(where) as store:
        store.append([night(1, 5_000.0)], source="test")
    monkeypatch.setattr(history_store, "VERSION", history_store.VERSION - 1)  # this code knows an older schema
    with pytest.raises(HistoryError, match=rf"schema version {history_store.VERSION + 1} is newer than this pytest-qwenperf knows \({history_store.VERSION}\); upgrade it"):
        HistoryStore.open(where)
    monkeypatch.undo()
    with HistoryStore.open(where) as store:
        assert store.count() == 1


CRASHER = """
import sys, time
from pathlib import Path
from pytest_qwenperf.gate.history_store import HistoryStore
from tests.test_history_store import night

def runs():
    yield night(1, 5_000.0)
    yield night(2, 5_000.0)
    Path(sys.argv[2]).write_text("two runs written, not committed")
    time.sleep(600)
    yield night(3, 5_000.0)

HistoryStore.open(sys.argv[1]).append(runs(), source="crash")
"""


def test_a_writer_killed_in_the_middle_of_an_append_leaves_the_store_as_it_was(where: str, tmp_path: Path) -> None:
    with HistoryStore.open(where) as store:
        store.append([night(9, 4_000.0)], source="before")
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, where, str(marker)], cwd=Path(__file__).parents[1])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the writer died before it was killed"
            assert time.monotonic() < deadline, "the writer never got to the middle of its append"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    with HistoryStore.open(where) as store:
        assert store.count() == 1
        assert store.append([night(1, 5_000.0)], source="after") == 1  # the lock died with the writer


def _append_nights(where: str, first_day: int) -> None:
    with HistoryStore.open(where) as store:
        for day in range(first_day, first_day + 5):
            store.append([night(day, 5_000.0 + day)], source=f"writer {os.getpid()}")


def test_writers_at_the_same_time_all_keep_their_runs(where: str) -> None:
    HistoryStore.open(where).close()
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_append_nights, args=(where, first)) for first in (1, 11, 21)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    with HistoryStore.open(where) as store:
        assert store.count() == 15
        assert len(store.series(output_key())) == 15


def test_a_store_that_cannot_be_opened_names_where(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=rf"{tmp_path / 'missing'}/h.sqlite: cannot open the history store"):
        HistoryStore.open(tmp_path / "missing" / "h.sqlite")


def test_a_postgresql_url_without_a_server_names_it_without_its_password() -> None:
    with pytest.raises(HistoryError, match=r"postgresql://qwen:\*\*\*@127.0.0.1:9/h\?connect_timeout=3: cannot open the history store: connection failed") as info:
        HistoryStore.open("postgresql://qwen:secret@127.0.0.1:9/h?connect_timeout=3")
    assert "secret" not in str(info.value)


def test_the_backends_answer_every_query_alike(postgres_server: Any, tmp_path: Path) -> None:
    """One history written to both; every query's answer is the same."""
    runs = [night(day, 5_000.0 - 30 * day, version="0.31.0" if day < 8 else "0.32.0") for day in range(1, 13)]
    runs += [night(day, 3_000.0, config="ctx-short") for day in range(1, 4)]
    answers = []
    for where in (str(tmp_path / "h.sqlite"), postgres_server.new_database()):
        with HistoryStore.open(where) as store:
            store.append(runs[:7], source="a")
            store.append(runs[5:], source="b")
            keys = store.keys()
            answers.append(
                (
                    store.count(),
                    keys,
                    [[(p.run_key, p.started, p.vllm_version, p.values) for p in store.series(k)] for k in keys],
                    store.keys(config="ctx-short"),
                )
            )
    assert answers[0] == answers[1]
    assert answers[0][0] == 15


def test_a_run_that_lost_data_is_kept_with_its_reason(where: str) -> None:
    data = make_run(failed=3, samples={"output_throughput": [5_000.0, 5_000.0, 5_000.0]})
    data["context"]["started"] = "2026-11-05T02:00:00+00:00"
    with HistoryStore.open(where) as store:
        store.append([night(4, 5_000.0), run_of(data)], source="test")
        assert [p.invalid for p in store.series(output_key())] == ["", "failed-requests"]


def test_the_series_shown_leave_invalid_runs_out(tmp_path: Path) -> None:
    from pytest_qwenperf.history.report import read_series

    lost = make_run(bound="the client could not keep up", samples={"output_throughput": [100.0, 100.0, 100.0]})
    lost["context"]["started"] = "2026-11-05T02:00:00+00:00"
    with HistoryStore.open(tmp_path / "h.sqlite") as store:
        store.append([night(day, 5_000.0) for day in range(1, 5)] + [run_of(lost)], source="test")
        (shown,) = read_series(store, metrics=("output_throughput",))
    assert len(shown.points) == 4 and all(p.values[1] == pytest.approx(5_000.0) for p in shown.points)
