"""No boiling frog, in a session: a history that slid a little each night fails the session once
the slide is confirmed and beyond the tolerance, although the reference (the last runs, cut at the
latest change) slid with it; a flat history does not. The session measures a stand-in server (no
vLLM); the history before it is the session's own first run copied to earlier nights, its output
throughput scaled, so that every other field is what the session itself records."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.gate.history_store import HistoryStore
from tests.stream_source import stream_source
from tests.test_max_repeats import write_suite

BASELINE_TEST = Path(__file__).parents[1] / "perf_tests" / "test_baseline.py"


def earlier(run: Run, night: int, scale: float) -> Run:
    """``run`` as if measured on October ``night``, its output throughput times ``scale`` (each repeat)."""
    samples = dict(run.samples or {})
    samples["output_throughput"] = tuple(None if v is None else v * scale for v in samples["output_throughput"])
    metrics = {**run.metrics, "output_throughput": float(run.metrics["output_throughput"]) * scale}
    context = msgspec.structs.replace(run.context, started=f"2026-10-{night:02d}T02:00:00+00:00")
    return msgspec.structs.replace(run, samples=samples, metrics=metrics, context=context)


@pytest.mark.parametrize(("shape", "fails"), [("slide", True), ("flat", False), ("slide-and-drop", True)])
def test_a_slow_slide_in_the_history_fails_the_session_and_a_flat_one_does_not(
    pytester: pytest.Pytester, shape: str, fails: bool
) -> None:
    write_suite(pytester.path)
    shutil.copy(BASELINE_TEST, pytester.path / "test_baseline.py")
    store = pytester.path / "history.sqlite"
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        args = ("-p", "no:cacheprovider", "-rA", "--qwenperf-suite=suite.toml", f"--qwenperf-endpoint={source.urls[0]}")
        first = pytester.runpytest_subprocess(*args, "--qwenperf-no-history", "--qwenperf-json=first.json")
        assert first.ret == pytest.ExitCode.OK, first.stdout.str()
        (data,) = json.loads((pytester.path / "first.json").read_text())["runs"]
        template = decode_run(data, "first.json")
        # 20 flat nights at a level the session's run is 20 % below, then -2 % a night for 9 nights
        # (the session is the 10th); or 29 flat nights at the session's own level.
        # "slide-and-drop": the same slide from a level half again as high, so the session is also a
        # regression against the runs it slid through (CI, 2026-12-02: a slowed session failed on its
        # slide alone, and the message never said it was a regression).
        top = 1.25 * (1.5 if shape == "slide-and-drop" else 1.0)
        scales = [top] * 20 + [top * (1 - 0.02 * k) for k in range(1, 10)] if shape != "flat" else [1.0] * 29
        with HistoryStore.open(store) as history:
            history.append([earlier(template, i + 1, s) for i, s in enumerate(scales)], source="test")
        second = pytester.runpytest_subprocess(*args, f"--qwenperf-history={store}", "--qwenperf-json=second.json")
    out = second.stdout.str()
    (run,) = json.loads((pytester.path / "second.json").read_text())["runs"]
    declined = [d["metric"] for d in run.get("declines", [])]
    if fails:
        assert second.ret == pytest.ExitCode.TESTS_FAILED, out
        # in the failure's message (its lines start with E), not only in the test's source it quotes
        assert re.search(r"^E\s+(AssertionError: )?the history shows a confirmed slide below the last good level", out, re.MULTILINE), out
        assert declined == ["output_throughput"], run.get("declines")
        assert re.search(r"output_throughput: the level is -\d+(\.\d)?% from the last good level", out), out
        assert "SLID: output_throughput" in out and "below the last good level in the history" in out  # the session table
        assert run["reference"].startswith("history: ")  # the reference slid with it: that alone would not see it
        dropped = "AssertionError: slower than the baseline beyond tolerance and noise" in out  # the message, not the source line
        assert dropped == (shape == "slide-and-drop"), out
    else:
        assert second.ret == pytest.ExitCode.OK, out
        assert declined == []
    with HistoryStore.open(store, create=False) as history:
        assert history.count() == 30  # the session's run is recorded either way
