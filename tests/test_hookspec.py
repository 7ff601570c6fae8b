"""The plugin's hooks, each used by tests/hooks_plugin.py in one candidate session against paced
stand-ins (no vLLM): the candidate streams at a third of the launcher's pace, so its point regresses,
is diagnosed, and every hook has something to see."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_qwenperf.plugin import hookspec
from tests.hooks_plugin import FLAG, TTFT_MS
from tests.test_candidate import paced, session

ROOT = Path(__file__).resolve().parents[1]


def test_every_hook_is_documented_and_named_for_the_plugin() -> None:
    hooks = {name: getattr(hookspec, name) for name in dir(hookspec) if name.startswith("pytest_qwenperf_")}
    assert len(hooks) == 6
    assert all((hook.__doc__ or "").strip() for hook in hooks.values()), [name for name, hook in hooks.items() if not hook.__doc__]
    documented = (ROOT / "docs" / "hooks.md").read_text()
    assert [name for name in hooks if f"`{name}`" not in documented] == []


def test_a_plugin_sees_changes_and_adds_through_every_hook(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    log = pytester.path / "hooks.jsonl"
    monkeypatch.setenv("HOOKS_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = session(
        pytester,
        "-p",
        "tests.hooks_plugin",
        f"--qwenperf-launcher={paced(5)}",
        f"--qwenperf-candidate={paced(15)}",
        "--qwenperf-json=out/results.json",
        f"--qwenperf-log-dir={pytester.path / 'logs'}",
        "--qwenperf-no-history",
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    by_hook = {hook: [c for c in calls if c["hook"] == hook] for hook in ("server_args", "run_measured", "point_judged")}

    # server args: called once for the suite's one config, before any boot; both servers got the flag and the variable
    assert by_hook["server_args"] == [{"hook": "server_args", "config": "standin/base", "args": []}]
    for folder in ("logs", "logs/candidate"):
        argv = json.loads((pytester.path / folder / "base.log").read_text().splitlines()[0].removeprefix("# qwenperf: "))
        assert argv[-1] == FLAG, argv
    candidate = json.loads((pytester.path / "out" / "results.json").read_text())
    (run,) = candidate["runs"]
    assert run["identity"]["argv"] == [FLAG]  # recorded as the config's own flags
    assert run["metrics"]["median_ttft_ms"] >= float(TTFT_MS)  # the stand-in's environment said 150 ms, not its default 20

    # the measured run and its verdicts: once for the point, with its repeats and the regression
    assert [c["point"] for c in by_hook["run_measured"]] == ["standin/base/w"] and by_hook["run_measured"][0]["repeats"] >= 2
    ((judged),) = by_hook["point_judged"]
    assert judged["verdicts"]["output_throughput"] == "regression", judged

    # a cause after the plugin's own, in the JSON and the test's failure message alike
    (verdicts,) = candidate["verdicts"]
    causes = verdicts["diagnosis"]["causes"]
    assert causes[-1]["kind"] == "plugin" and "the team's dashboard saw" in causes[-1]["text"]
    assert all(cause["kind"] != "plugin" for cause in causes[:-1])

    # a column in both sides' tables, and a key in both sides' files
    header = next(line for line in result.stdout.lines if line.startswith("config / workload"))
    assert "TTFT p50" in header and header.index("took (plan)") < header.index("TTFT p50") < header.index("  vs")
    rows = [line for line in result.stdout.lines if line.startswith("standin/base / w")]
    assert len(rows) == 2 and all(re.search(r" (1[5-9]\d|[2-9]\d\d)ms  ", row) for row in rows), rows  # TTFT p50 >= 150 ms
    reference = json.loads((pytester.path / "out" / "results.reference.json").read_text())
    assert candidate["team"] == reference["team"] == {"runs_seen": 1}
