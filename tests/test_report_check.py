"""The check CI runs on the perf suite's own report (``tests/report_check.py``): it passes a
session's report, and names what a report lacks against the session it claims to show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_qwenperf.gate.compare import load_runs
from pytest_qwenperf.report.html import write_report
from tests.report_check import main
from tests.test_report import judged, run_with, session


def test_a_sessions_report_passes_and_one_missing_a_run_and_a_verdict_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [run_with("base", "isl128-osl128"), run_with("ctx-short", "isl128-osl128")]
    verdicts = [judged("base", "isl128-osl128", "pass"), judged("ctx-short", "isl128-osl128", "regression", "pass")]
    path = session(tmp_path / "s.json", runs, verdicts)
    write_report([load_runs(path)], tmp_path / "report.html")
    assert main([str(path), str(tmp_path / "report.html"), str(tmp_path / "shot.png")]) == 0
    assert (tmp_path / "shot.png").stat().st_size > 0
    assert "2 run(s), 3 verdict row(s)" in capsys.readouterr().out

    # The same page held against a session with one run and one verdict more than it shows.
    data = json.loads(path.read_text())
    data["runs"].append(run_with("fp8kv", "isl128-osl128"))
    data["verdicts"].append(judged("fp8kv", "isl128-osl128", "pass"))
    (tmp_path / "more.json").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)  # named as CI names them, relative to where it runs
    assert main(["more.json", "report.html", "shot.png"]) == 1
    err = capsys.readouterr().err
    assert "2 point section(s) for the session's 3 run(s)" in err and "3 verdict row(s) for the session's 4 judgement(s)" in err
