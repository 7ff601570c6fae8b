"""The HTML report: what its page holds (verdicts, regressions first, charts, environment
differences), that every chart's spec compiles, that a suite's worth of runs stays under its size
limit, and that a real browser draws it with the network cut off, in light and dark mode, and prints it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import markupsafe
import msgspec
import pytest
import vl_convert  # at collection: a PyO3 module cannot be initialized twice, and pytester's inline runs drop what they imported

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.core.canary import EXACT, judge_canary
from pytest_qwenperf.core.formats import SESSION_SCHEMA
from pytest_qwenperf.core.profile import OperatorProfile, OperatorShare, OperatorTable
from pytest_qwenperf.core.timeline import SERIES, Timeline
from pytest_qwenperf.core.verdict import Hearing, Judgement, Side, judge
from pytest_qwenperf.gate.compare import load_runs
from pytest_qwenperf.gate.diagnosis import Cause, Diagnosis
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.report.html import render, write_report
from pytest_qwenperf.report.page import anchor_of, history_series, page_of
from tests.browser import browse, chromium, print_pdf
from tests.faults.test_files import BOOTS, CPU_RUN, STANDIN, inner, runs, unwritable_path
from tests.test_baseline import make_run
from tests.test_canary import make_canary
from tests.test_history_store import night
from tests.test_pareto import search_of

SIZE_LIMIT = 5_000_000
__all__ = ["runs"]  # the fixture, shared with tests/faults/test_files.py


def timeline_of(seconds: int = 60, series: tuple[str, ...] = tuple(SERIES)) -> dict[str, Any]:
    """A run's timeline of ``seconds`` one-second bins for each of ``series`` (a gap every tenth bin)."""
    values = {name: tuple(None if i % 10 == 9 else float(i % 7) + 0.5 for i in range(seconds)) for name in series}
    return msgspec.to_builtins(Timeline(bin_s=1.0, window=(5.0, seconds - 5.0), series=values))


def run_with(config: str, workload: str, *, output: float = 5_000.0, engine: str = "8192", version: str = "0.32.0") -> dict[str, Any]:
    run = make_run(config, workload, output=output, version=version, samples={"output_throughput": [output * 0.98, output, output * 1.02]})
    run["timeline"] = timeline_of()
    run["distributions"] = {name: [float(q + 1) for q in range(101)] for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")}
    run["context"]["environment"] = {"vllm_version": version, "torch": "2.13.0+cpu", "engine": {"max_num_batched_tokens": engine, "dtype": "bfloat16"}}
    return run


def session(path: Path, runs: list[dict[str, Any]], verdicts: list[dict[str, Any]] = (), **more: Any) -> Path:
    data = {"schema": SESSION_SCHEMA, "hardware": {}, "boots": {}, "runs": runs, "canaries": [], "verdicts": verdicts, **more}
    path.write_text(json.dumps(data))
    return path


def judged(config: str, workload: str, *verdicts: str) -> dict[str, Any]:
    judgements = [
        msgspec.to_builtins(Judgement(f"metric_{i}", "tok/s", "higher", 100.0, 80.0, 0.8, 0.1, verdict, f"{verdict} detail"))
        for i, verdict in enumerate(verdicts)
    ]
    return {"suite": "cpu", "config": config, "workload": workload, "judgements": judgements}


def test_one_session_shows_the_verdicts_it_decided_regressions_and_invalid_runs_first(tmp_path: Path) -> None:
    path = session(
        tmp_path / "s.json",
        [run_with("base", "isl128-osl128"), run_with("ctx-short", "isl128-osl128")],
        [judged("base", "isl128-osl128", "pass", "improvement"), judged("ctx-short", "isl128-osl128", "noisy", "regression", "invalid")],
    )
    page = page_of([load_runs(path)])
    assert [row.kind for row in page.rows] == ["invalid", "regression", "noisy", "pass", "improvement"]
    assert all(not point.causes for point in page.points)  # the session kept no diagnosis
    assert page.rows[0].anchor == anchor_of(("cpu", "ctx-short", "isl128-osl128")) == "point-cpu-ctx-short-isl128-osl128"
    assert page.counts == {"invalid": 1, "regression": 1, "noisy": 1, "pass": 1, "improvement": 1}
    assert {point.anchor for point in page.points} == {row.anchor for row in page.rows}
    (point, _) = page.points
    assert point.distributions in page.charts and next(chart for _, chart in point.timelines) in page.charts
    assert page.ladder == "ladder" and page.pareto is None  # no capacity search ran
    html = render(page)
    assert html.count('class="v-regression"') == 1 and 'href="#point-cpu-ctx-short-isl128-osl128"' in html


def test_the_verdict_table_shows_the_interval_each_verdict_was_decided_on(tmp_path: Path) -> None:
    before, after = Side((100.0, 102.0, 98.0)), Side((90.0, 92.0, 88.0))
    judgement = judge(Hearing("output_throughput", before, after, direction="higher", tolerance=0.05, unit="tok/s"))
    assert judgement.verdict == "regression" and judgement.interval is not None and judgement.ratio is not None
    low, high = judgement.interval
    assert math.sqrt(low * high) == pytest.approx(judgement.ratio)  # symmetric about the ratio on the log scale
    assert 1 - low / judgement.ratio == pytest.approx(judgement.mde)  # its half-width is the MDE
    older = msgspec.to_builtins(Judgement("metric_0", "tok/s", "higher", 100.0, 80.0, 0.8, 0.1, "noisy", "from an older session"))
    del older["interval"]  # a session JSON written before judgements kept their interval
    verdicts = {"suite": "cpu", "config": "base", "workload": "isl128-osl128", "judgements": [msgspec.to_builtins(judgement), older]}
    page = page_of([load_runs(session(tmp_path / "s.json", [run_with("base", "isl128-osl128")], [verdicts]))])
    judged_now, judged_before = page.rows
    assert (judged_now.interval, judged_now.confidence, judged_before.interval, judged_before.confidence) == ("0.858–0.944", "95%", "—", "")
    assert "95% interval 0.858–0.944 (" in judged_now.detail  # the interval the verdict was decided on
    assert page.interval_heading == "95% interval"
    html = render(page)
    assert ">95% interval</th>" in html and 'title="95% interval of now / reference">0.858–0.944</td>' in html
    mixed = dataclasses.replace(page, rows=(judged_now, dataclasses.replace(judged_before, interval="0.831–0.975", confidence="99%")))
    assert mixed.interval_heading == "interval"  # each cell's title names its confidence


def test_one_session_shows_each_canary_answer_as_it_judged_it(tmp_path: Path) -> None:
    reference = make_canary(outputs=((1, 2, 3), (4, 5, 6)))
    now, other = make_canary(outputs=((1, 2, 3), (4, 9, 9))), make_canary("ctx-short")
    judged = judge_canary(reference, now, EXACT)
    answers = [msgspec.to_builtins(answer) for answer in (now, other)]
    path = session(tmp_path / "s.json", [run_with("base", "isl128-osl128")], canaries=answers, canary_verdicts=[msgspec.to_builtins(judged)])
    page = page_of([load_runs(path)])
    by_config = {line.config: line for line in page.canaries}
    assert (by_config["cpu/base"].verdict, by_config["cpu/base"].match_rate) == ("changed-output", "50.0%")
    assert "first differing prompt 1" in by_config["cpu/base"].detail
    assert (by_config["cpu/ctx-short"].verdict, by_config["cpu/ctx-short"].detail) == ("answered", "2 prompts answered")  # judged nowhere
    assert "first differing prompt 1" in render(page)


def test_one_session_shows_why_a_run_regressed_against_its_baseline(tmp_path: Path) -> None:
    why = Diagnosis(
        changed=("metric_0",),
        causes=(Cause(kind="telemetry", subject="kv_cache_usage", text="KV-cache usage (fraction): 0.5 → 0.91", figures=()),),
    )
    verdicts = judged("ctx-short", "isl128-osl128", "regression") | {"diagnosis": msgspec.to_builtins(why)}
    path = session(tmp_path / "s.json", [run_with("ctx-short", "isl128-osl128")], [verdicts])
    page = page_of([load_runs(path)])
    (point,) = page.points
    assert point.causes == ((page.columns[0], ("telemetry: KV-cache usage (fraction): 0.5 → 0.91",)),)
    assert "KV-cache usage (fraction): 0.5 → 0.91" in render(page)


def test_a_comparison_judges_the_later_session_and_highlights_what_changed(tmp_path: Path) -> None:
    old = session(tmp_path / "old.json", [run_with("base", "isl128-osl128", version="0.31.0", engine="8192")])
    new = session(tmp_path / "new.json", [run_with("base", "isl128-osl128", output=2_500.0, engine="2048")])
    page = page_of([load_runs(old), load_runs(new)])
    assert page.columns == ("0.31.0", "0.32.0")
    by_metric = {row.metric: row for row in page.rows}
    assert by_metric["output_throughput (tok/s)"].kind == "regression" and page.rows[0].kind == "regression"
    (point,) = page.points
    changed = {field.name: field.values for field in point.fields if field.changed}
    assert changed["engine.max_num_batched_tokens"] == ("8192", "2048") and changed["vllm_version"] == ("0.31.0", "0.32.0")
    assert "engine.dtype" in {field.name for field in point.fields if not field.changed}
    assert len(point.timelines) == 2  # one per side
    ((column, causes),) = point.causes
    assert column == "0.32.0" and causes[0].startswith("engine-config: engine.max_num_batched_tokens: 8192 vs 2048 (reference vs run)")
    distributions = page.charts[point.distributions or ""]
    assert {row["label"] for row in distributions["data"]["values"]} == {"0.31.0", "0.32.0"}  # type: ignore[index]


def test_a_point_a_later_session_lacks_keeps_its_fields_under_their_columns(tmp_path: Path) -> None:
    old = session(tmp_path / "old.json", [run_with("base", "isl128-osl128", version="0.31.0"), run_with("ctx-short", "isl128-osl128")])
    new = session(tmp_path / "new.json", [run_with("base", "isl128-osl128")])
    page = page_of([load_runs(old), load_runs(new)])
    (lacking,) = [point for point in page.points if point.anchor == "point-cpu-ctx-short-isl128-osl128"]
    assert [run is None for _, run in lacking.runs] == [False, True]
    torch = next(field for field in lacking.fields if field.name == "torch")
    assert torch.values == ("2.13.0+cpu", "—") and not torch.changed  # one run: nothing differs
    assert any(row.kind == "missing" for row in page.rows)


def test_capacity_probes_whose_devices_cannot_be_counted_say_why_there_is_no_pareto_chart(tmp_path: Path) -> None:
    run = run_with("base", "isl128-osl128")
    probe = {"load": 8.0, "latencies": {}, "output_throughput": 100.0, "mean_tpot_ms": 10.0, "stopped": None}
    search = {"search": "concurrency", "slo": {"p99_ttft_ms": 500.0}, "load": 8.0, "interval": None, "output_throughput": 100.0,
              "binding": None, "cliff": False, "bound": "found", "probes": [probe]}  # fmt: skip
    run["capacity"] = [search]
    run["telemetry"] = None  # no server cores recorded: no device count on the CPU build
    page = page_of([load_runs(session(tmp_path / "s.json", [run]))])
    assert page.pareto is None and page.pareto_missing is not None and page.pareto_missing.startswith("not drawn: ")
    assert str(markupsafe.escape(page.pareto_missing)) in render(page)


def test_capacity_probes_are_drawn_on_the_pareto_chart_with_their_frontier(tmp_path: Path) -> None:
    run = run_with("base", "isl128-osl128")
    run["telemetry"]["cpu"] = {"server_cores": {"cores": [0, 1]}}  # two cores: per device is half the throughput
    run["capacity"] = [
        search_of(
            (16.0, 800.0, 10.0, None),
            (20.0, 700.0, 12.5, None),  # beaten by the probe at 24
            (24.0, 900.0, 12.5, None),
            (32.0, 1_000.0, 20.0, "3 request(s) failed"),
        )
    ]
    page = page_of([load_runs(session(tmp_path / "s.json", [run]))])
    assert page.pareto == "pareto" and page.pareto_missing is None
    rows = page.charts["pareto"]["data"]["values"]  # type: ignore[index]
    assert [(row["per_user"], row["per_device"], row["frontier"]) for row in rows] == [
        (100.0, 400.0, True),
        (80.0, 350.0, False),
        (80.0, 450.0, True),
    ]  # the stopped probe is past the capacity: no point
    assert {row["rung"] for row in rows} == {"cpu/base"} and rows[0]["source"] == "s.json, search 1 of 1, probe at 16"
    svg = vl_convert.vegalite_to_svg(page.charts["pareto"])
    assert svg.count('aria-roledescription="point"') == 3 and "output tok/s per core" in svg  # a mark per point, the device on the axis
    assert 'data-chart="pareto"' in render(page)


def test_a_points_history_marks_each_change_point_on_its_chart(tmp_path: Path) -> None:
    with HistoryStore.open(str(tmp_path / "history.sqlite")) as store:
        store.append([night(day, 5_000.0 if day <= 6 else 4_000.0) for day in range(1, 13)], source="test")  # -20 % from night 7
        history = history_series(store)
    page = page_of([load_runs(session(tmp_path / "s.json", [run_with("base", "isl128-osl128")]))], history=history)
    (point,) = page.points
    assert point.history is not None
    spec = page.charts[point.history]
    rows = spec["data"]["values"]  # type: ignore[index]
    steps = [row for row in rows if row["kind"] == "step"]
    assert steps == [{"kind": "step", "metric": "output_throughput", "run": 6.5, "direction": "worse", "change": "-20.0%"}]
    assert len([row for row in rows if row["kind"] == "run" and row["metric"] == "output_throughput"]) == 12
    (rule,) = [layer for layer in spec["spec"]["layer"] if layer["mark"]["type"] == "rule"]  # type: ignore[index]
    assert rule["encoding"]["color"]["field"] == "direction"
    svg = vl_convert.vegalite_to_svg(spec)
    assert svg.count('stroke="#d62728" stroke-dasharray="4,2"') == 1  # one dashed rule, red: a step for the worse


def profile_of(shares: dict[str, float]) -> dict[str, Any]:
    operators = [OperatorShare(name=name, self_us=share * 1000.0, share=share, count=10) for name, share in shares.items()]
    return msgspec.to_builtins(OperatorProfile(traces=("t.pt.trace.json.gz",), cpu=OperatorTable(total_us=1000.0, operators=tuple(operators))))


def test_a_profiled_pair_shows_each_sides_top_operators_and_their_share_changes(tmp_path: Path) -> None:
    old, new = run_with("base", "isl128-osl128", version="0.31.0"), run_with("base", "isl128-osl128")
    old["profile"] = profile_of({"aten::mm": 0.6, "aten::add": 0.3, "step": 0.1})
    new["profile"] = profile_of({"aten::mm": 0.4, "step": 0.35, "aten::add": 0.25})
    page = page_of([load_runs(session(tmp_path / "old.json", [old])), load_runs(session(tmp_path / "new.json", [new]))])
    (point,) = page.points
    assert point.operators == (
        ("0.31.0", (("aten::mm", "60.0%"), ("aten::add", "30.0%"), ("step", "10.0%"))),
        ("0.32.0", (("aten::mm", "40.0%"), ("step", "35.0%"), ("aten::add", "25.0%"))),
    )
    (column, changes), = point.operator_changes
    assert column == "0.32.0" and changes[:2] == ("step: 10.0% → 35.0% (+25.0 pt)", "aten::mm: 60.0% → 40.0% (-20.0 pt)")
    assert "Operators by self time" in render(page)


def test_every_chart_compiles_to_an_svg(tmp_path: Path) -> None:
    old = session(tmp_path / "old.json", [run_with("base", "isl128-osl128", version="0.31.0")])
    new = session(tmp_path / "new.json", [run_with("base", "isl128-osl128", output=4_000.0)])
    page = page_of([load_runs(old), load_runs(new)])
    assert len(page.charts) == 4  # the ladder, two timelines, the distributions
    for name, spec in page.charts.items():
        svg = vl_convert.vegalite_to_svg(spec)
        assert svg.startswith("<svg") and svg.count("<path") > 2, name


def test_a_b200_sized_session_stays_under_five_megabytes(tmp_path: Path) -> None:
    """The b200 suite's points (8 rungs x 4 workloads), each with a full timeline (240 bins of every
    series) and its distributions, against a second session of the same size."""
    configs = ("base", "ctx-short", "seqs-32", "ngram-spec")
    runs = []
    for i in range(8):
        for j in range(4):
            run = run_with(configs[i % 4], "isl128-osl128")
            run["identity"] |= {"config": f"rung{i}", "workload": f"w{j}"}
            run["timeline"] = timeline_of(240)
            runs.append(run)
    sides = [session(tmp_path / f"{name}.json", runs) for name in ("a", "b")]
    written = tmp_path / "report.html"
    write_report([load_runs(path) for path in sides], written)
    assert written.stat().st_size < SIZE_LIMIT


def test_the_report_command_writes_and_keeps_the_previous_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = session(tmp_path / "s.json", [run_with("base", "isl128-osl128")], [judged("base", "isl128-osl128", "pass")])
    out = tmp_path / "out" / "report.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    first = out.read_text()
    assert first.startswith("<!doctype html>") and "vegaEmbed" in first
    assert main(["report", str(path), "-o", str(out), "--title", "again"]) == 0
    kept = [p for p in out.parent.iterdir() if p != out]
    assert len(kept) == 1 and kept[0].read_text() == first and "kept as" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "absent.json"), "-o", str(out)]) == 2
    assert "absent.json: cannot read the results file" in capsys.readouterr().err


# ------------------------------------------------------------------ in a real browser


@pytest.mark.parametrize(("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_without_chromium_the_browser_tests_skip_outside_ci_and_fail_in_it(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"Debian's chromium is needed .*\(apt-get install chromium\)"):
        chromium()


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    old = session(folder / "old.json", [run_with("base", "isl128-osl128", version="0.31.0"), run_with("ctx-short", "isl128-osl128")])
    new = session(folder / "new.json", [run_with("base", "isl128-osl128", output=2_000.0), run_with("ctx-short", "isl128-osl128")])
    write_report([load_runs(old), load_runs(new)], folder / "report.html")
    return folder / "report.html"


def test_a_browser_draws_every_chart_offline(report_file: Path) -> None:
    browsed = browse(report_file)
    assert 'data-charts="drawn"' in browsed.dom and browsed.console == ()
    charts = browsed.charts()
    assert len(charts) == 7 and set(charts.values()) == {"yes"}  # the ladder, 2 points x (2 timelines + distributions)
    assert browsed.dom.count("<svg") >= len(charts) and 'data-scheme="light"' in browsed.dom


def test_the_page_follows_a_dark_colour_scheme(report_file: Path) -> None:
    browsed = browse(report_file, "--blink-settings=preferredColorScheme=0")
    assert 'data-scheme="dark"' in browsed.dom and 'data-charts="drawn"' in browsed.dom


def test_the_page_prints(report_file: Path, tmp_path: Path) -> None:
    data = print_pdf(report_file, tmp_path / "report.pdf")
    assert data.startswith(b"%PDF") and len(re.findall(rb"/Type\s*/Page\b", data)) >= 2


# ------------------------------------------------------------------ from pytest, and a history


def test_a_session_writes_its_report_with_each_points_history(runs: pytest.Pytester) -> None:
    runs.makepyfile(test_measure=CPU_RUN.format(total=10_000.0))
    for total in (10_000.0, 10_200.0, 9_900.0):
        runs.makepyfile(test_measure=CPU_RUN.format(total=total))
        done = inner(runs, "--qwenperf-html=out/report.html")
        assert done.returncode == 0, done.stdout + done.stderr
    assert "qwenperf: HTML report written to out/report.html (previous file kept as " in done.stdout
    html = (runs.path / "out" / "report.html").read_text()
    specs = json.loads(html.split('<script type="application/json" id="chart-specs">', 1)[1].split("</script>", 1)[0])
    history = specs["point-cpu-base-isl128-osl128-history"]["data"]["values"]
    assert [row["value"] for row in history if row["kind"] == "run" and row["metric"] == "output_throughput"] == [5_000.0, 5_100.0, 4_950.0]
    assert len(list((runs.path / "out").iterdir())) == 3  # the two earlier reports kept
    browsed = browse(runs.path / "out" / "report.html")  # a history without change points draws without a warning
    assert browsed.console == () and "point-cpu-base-isl128-osl128-history" in browsed.charts()


def test_an_unwritable_report_fails_before_any_server_boots(pytester: pytest.Pytester, tmp_path: Path) -> None:
    target = unwritable_path(tmp_path, "parent-is-a-file")
    pytester.makepyfile(test_boot=BOOTS)
    done = inner(pytester, f"--qwenperf-launcher={STANDIN}", f"--qwenperf-html={target}", "--qwenperf-log-dir=logs")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"--qwenperf-html {target} (or ini qwenperf_html): cannot write the report there: " in done.stderr
    assert not (pytester.path / "booted").exists()
