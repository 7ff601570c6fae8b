"""The session table's closing lines: how the runner's noise compares with the tolerance, said
once, the traces replayed, and the points whose history slid."""

from __future__ import annotations

from pathlib import Path

import msgspec

from pytest_qwenperf.core.run import PROMPT_LENGTHS, Decline, Loss, ServerCounters, TraceReplay
from pytest_qwenperf.core.tables import format_duration
from pytest_qwenperf.core.verdict import Hearing, Side, judge
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.session_table import noise_line, session_table
from pytest_qwenperf.suite.config import load_suite
from pytest_qwenperf.suite.cost import plan, points_of
from tests.test_history_store import night


def test_the_noise_line_compares_the_spread_and_the_mde_with_the_tolerance() -> None:
    report = SessionReport()
    assert noise_line(report) is None  # nothing judged: nothing to say
    quiet = night(20, 5_000.0, config="base")  # repeats ±1 %
    now = Side((5_000.0, 5_050.0, 4_950.0))
    tight = judge(Hearing("output_throughput", Side((5_000.0, 5_010.0, 4_990.0)), now, direction="higher", tolerance=0.10))
    report.add(quiet, (tight,))
    line = noise_line(report)
    assert line is not None and line.startswith("runner noise, output_throughput: repeats spread 1.0% (median CV)")
    assert "how far sessions differ is not known (no reference of 3 or more runs)" in line
    assert line.endswith("against a tolerance of 10%: 0 of 1 point(s) could not see a change of the tolerance's size")

    sessions = Side(tuple(5_000.0 * f for level in (1.0, 1.2, 0.9) for f in (level * 0.99, level, level * 1.01)), (3, 3, 3))
    wide = judge(Hearing("output_throughput", sessions, now, direction="higher", tolerance=0.10))
    report.add(night(21, 5_000.0, config="ctx-short"), (wide,))
    line = noise_line(report)
    assert line is not None and "sessions differ by 15.7% (SD, 1 history reference(s))" in line
    assert line.endswith("1 of 2 point(s) could not see a change of the tolerance's size")
    assert line in session_table(report)


def test_a_slid_point_is_marked_and_its_decline_listed_after_the_table() -> None:
    report = SessionReport()
    decline = Decline(
        metric="output_throughput", good=5_000.0, current=4_100.0, tolerance=0.1, step=21, since=None, versions=None
    )
    report.add(msgspec.structs.replace(night(20, 4_100.0), declines=(decline,)))
    lines = session_table(report)
    assert lines[2].endswith("SLID: output_throughput")
    assert lines[-2] == "below the last good level in the history (a slide the reference slid with):"
    assert lines[-1] == (
        "  cpu/base / isl128-osl128: output_throughput: the level is -18.0% from the last good level 5,000 tok/s "
        "(before the step at run #21), beyond the tolerance 10%"
    )


def test_a_replayed_trace_says_how_late_it_went_its_lengths_and_what_the_cache_could_hit_against_what_it_hit() -> None:
    report = SessionReport()
    run = night(20, 5_000.0)
    lags = {**run.metrics, "p50_scheduling_lag_ms": 0.4131335000057425, "p99_scheduling_lag_ms": 1.93}
    cached = ServerCounters.of({"prefix_cache_hits": 640.0, "prefix_cache_queries": 1_000.0})
    report.add(msgspec.structs.replace(run, metrics=lags, server=cached, trace=TraceReplay(cacheable_share=0.679, time_scale=1.0)))
    short = night(20, 5_000.0, config="ctx-short")
    report.add(
        msgspec.structs.replace(
            short,
            metrics={**short.metrics, "failed": 2},
            conditions=(Loss(reason=PROMPT_LENGTHS, detail="request 7 counted 300 prompt tokens of 256"),),
            trace=TraceReplay(cacheable_share=0.5),
        )
    )
    lines = session_table(report)
    at = lines.index("traces replayed:")
    assert lines[at + 1 : at + 3] == [
        (
            "  cpu/base / isl128-osl128: sent at the traced times x1, late by p50 0.413 ms, p99 1.93 ms; "
            "prompt and output lengths as traced (the server's counts); "
            "67.9% of prompt tokens could hit a prefix cache, the server hit 64.0%"
        ),
        (
            "  cpu/ctx-short / isl128-osl128: sent by a loop, not at the traced times; "
            "request 7 counted 300 prompt tokens of 256; 2 request(s) failed or ended short of the traced output length; "
            "50.0% of prompt tokens could hit a prefix cache, prefix caching off or not counted"
        ),
    ]


def test_each_point_says_what_it_took_against_the_plan_and_the_points_only_sessions_can_settle() -> None:
    suite = load_suite(Path(__file__).resolve().parents[1] / "perf_tests" / "suites" / "cpu.toml")
    report = SessionReport()
    report.plans = (plan(suite, points_of(suite, ["base"], ["isl128-osl128"]), {}),)
    planned_s = report.plans[0].points[0].planned_s
    assert planned_s is not None
    report.add(msgspec.structs.replace(night(20, 5_000.0, config="base"), elapsed_s=52.4, needs_sessions=True))
    report.add(night(21, 5_000.0, config="ctx-short"))  # not timed, not planned
    lines = session_table(report)
    assert "took (plan)" in lines[0]
    assert f"52 s ({format_duration(planned_s)})" in lines[2] and "—  " in lines[3]
    assert any(line.startswith("undecided where only more sessions can settle it, so no repeat was spent on it: 1 point(s)") for line in lines)
    plans = report.as_json()["plans"]
    assert isinstance(plans, list) and plans[0]["points"][0]["elapsed_s"] == 52.4
