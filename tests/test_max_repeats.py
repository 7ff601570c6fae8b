"""The most repeats of a point: option → ini key → the suite's max_repeats → the repeats in force, and a
session that runs them while a verdict is undecided (against a stand-in server, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_qwenperf.core.identity import Context
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.gate.baseline import Baseline, Provenance, StoredMetric, save_baseline
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.suite.config import SuiteError, load_suite
from tests.stream_source import stream_source

SUITE = """\
[suite]
name = "standin"
hardware = "cpu"
model = "embedded:tiny"
repeats = 2
{max_repeats}

[[config]]
id = "base"

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello world"
output_len = 4
num_prompts = 8
load = {{ concurrency = 2 }}
"""

PLAN = """
from pytest_qwenperf.plugin.settings import SUITES_KEY, repeat_plan

def test_plan(pytestconfig, qwenperf_settings):
    (suite,) = pytestconfig.stash[SUITES_KEY]
    plan = repeat_plan(qwenperf_settings, suite)
    print(f"PLAN first={plan.first} most={plan.most} least={plan.least}")
"""


def write_suite(folder: Path, max_repeats: int | None = None) -> Path:
    path = folder / "suite.toml"
    path.write_text(SUITE.format(max_repeats="" if max_repeats is None else f"max_repeats = {max_repeats}"))
    return path


def plan_of(pytester: pytest.Pytester, *args: str, suite_max: int | None = None, ini: str = "") -> pytest.RunResult:
    write_suite(pytester.path, suite_max)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_plan=PLAN)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--qwenperf-suite=suite.toml", *args)


@pytest.mark.parametrize(
    ("args", "suite_max", "ini", "first", "most"),
    [
        ((), None, "", 2, 2),  # no maximum anywhere: the repeats in force, none extra
        ((), 5, "", 2, 5),  # the suite's
        (("--qwenperf-repeats=4",), None, "", 4, 4),  # the repeats in force, wherever they came from
        (("--qwenperf-repeats=3",), 5, "", 3, 5),
        ((), 5, "qwenperf_max_repeats = 3", 2, 3),  # ini over the suite
        (("--qwenperf-max-repeats=4",), 5, "qwenperf_max_repeats = 3", 2, 4),  # the option over both
        (("--qwenperf-repeats=3", "--qwenperf-max-repeats=3"), 5, "", 3, 3),
        (("--qwenperf-repeats=6",), 5, "", 6, 6),  # a suite's own budget rises to the repeats asked for
    ],
)
def test_the_most_repeats_resolve_option_ini_suite_then_the_repeats(
    pytester: pytest.Pytester, args: tuple[str, ...], suite_max: int | None, ini: str, first: int, most: int
) -> None:
    result = plan_of(pytester, *args, suite_max=suite_max, ini=ini)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([f"*PLAN first={first} most={most}*"])


@pytest.mark.parametrize(("args", "least"), [((), "None"), (("--qwenperf-repeats=4",), "2")])
def test_a_suites_earliest_look_comes_before_the_repeats_in_force_or_not_at_all(
    pytester: pytest.Pytester, args: tuple[str, ...], least: str
) -> None:
    """The suite's min_repeats = 2 is no early look at its own 2 repeats; with 4 asked for, it is."""
    write_suite(pytester.path, None)
    (pytester.path / "suite.toml").write_text(
        (pytester.path / "suite.toml").read_text().replace("repeats = 2", "repeats = 2\nmin_repeats = 2")
    )
    pytester.makepyfile(test_plan=PLAN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--qwenperf-suite=suite.toml", *args)
    result.stdout.fnmatch_lines([f"*PLAN first=* most=* least={least}*"])


@pytest.mark.parametrize(
    ("args", "suite_max", "ini", "most_from", "first_from"),
    [
        (("--qwenperf-max-repeats=1",), None, "", "1 (--qwenperf-max-repeats)", "2 ({suite}: suite.repeats)"),
        ((), None, "qwenperf_max_repeats = 1", "1 ({ini}: ini key qwenperf_max_repeats)", "2 ({suite}: suite.repeats)"),
        (("--qwenperf-max-repeats=3",), None, "qwenperf_repeats = 4", "3 (--qwenperf-max-repeats)", "4 ({ini}: ini key qwenperf_repeats)"),
    ],
)
def test_a_most_below_the_repeats_in_force_is_a_usage_error_naming_both_and_where_from(
    pytester: pytest.Pytester, args: tuple[str, ...], suite_max: int | None, ini: str, most_from: str, first_from: str
) -> None:
    result = plan_of(pytester, *args, suite_max=suite_max, ini=ini)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    where = {"suite": "suite.toml", "ini": pytester.path / "tox.ini"}  # the suite as given, the ini file found
    result.stderr.fnmatch_lines(
        [f"*suite standin: max repeats {most_from.format(**where)} is below the repeats in force, {first_from.format(**where)}; expected*"]
    )
    assert "PLAN" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (("--qwenperf-max-repeats=0",), "", "*--qwenperf-max-repeats*expected a whole number >= 1, got '0'*"),
        ((), "qwenperf_max_repeats = lots", "*tox.ini: ini key qwenperf_max_repeats: expected a whole number, got 'lots'*"),
    ],
)
def test_a_bad_most_fails_at_parsing(pytester: pytest.Pytester, args: tuple[str, ...], ini: str, message: str) -> None:
    result = plan_of(pytester, *args, ini=ini)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_suite_whose_most_is_below_its_repeats_names_the_file_and_both_keys(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match=r"suite.max_repeats: expected a whole number of load runs >= suite.repeats \(2\), got 1$"):
        load_suite(write_suite(tmp_path, 1))
    assert load_suite(write_suite(tmp_path, 2)).max_repeats == 2
    assert load_suite(write_suite(tmp_path)).max_repeats is None


def test_the_cpu_suite_allows_extra_repeats() -> None:
    cpu = load_suite(Path(__file__).parents[1] / "perf_tests" / "suites" / "cpu.toml")
    assert cpu.max_repeats is not None and cpu.max_repeats > cpu.repeats


# ---------------------------------------------------------------- a session


GATE = """
import json

def test_gate(qwenperf_judgements):
    with open("judgements.json", "w") as out:
        json.dump([[j.metric, j.verdict, j.confidence] for j in qwenperf_judgements], out)
"""


def test_an_undecided_point_no_repeat_can_settle_takes_none_and_the_gate_warns_without_failing(pytester: pytest.Pytester) -> None:
    """A baseline whose spread decides nothing keeps the verdict on output throughput undecided
    however many repeats the run takes: no extra repeat is spent, the verdicts come from the first
    look, and the session says the point needs sessions, not repeats."""
    suite = load_suite(write_suite(pytester.path, 4))
    identity = suite.identity("base", "w", hardware=detect().id)
    hopeless = StoredMetric.of("output_throughput", (1e-12, 1e-2))  # far below any run and spread over ten decades
    save_baseline(
        pytester.path / "baselines",
        Baseline(
            identity=identity,
            context=Context(),
            metrics={"output_throughput": hopeless},
            provenance=Provenance(kind="measured", source="test"),
            history=(),
        ),
    )
    pytester.makepyfile(test_gate=GATE)
    pytester.makepyfile(test_baseline=(Path(__file__).parents[1] / "perf_tests" / "test_baseline.py").read_text())
    # Paced tokens: a source that answers at once keeps the client's core busy, and a loaded
    # machine then judges the run client-bound (invalid: no extra repeats), not undecided.
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        result = pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            "--qwenperf-suite=suite.toml",
            f"--qwenperf-endpoint={source.urls[0]}",
            "--qwenperf-json=results.json",
            "-W",
            "default",
        )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    assert result.parseoutcomes()["passed"] == 2, output
    (run,) = json.loads((pytester.path / "results.json").read_text())["runs"]
    assert run["extra_repeats"] == 0 and len(run["samples"]["output_throughput"]) == 2 and run["needs_sessions"]
    judged = {
        metric: (verdict, confidence)
        for metric, verdict, confidence in json.loads((pytester.path / "judgements.json").read_text())
    }
    assert judged["output_throughput"] == ("underpowered", SequentialPlan(0.95, 2, 4).confidence_at(2))
    result.stdout.fnmatch_lines(
        [
            "*extra*out MDE*",
            "standin/base / w * 0  100.0% * stored baseline",  # no extra repeat; the MDE a baseline spread over ten decades leaves
            "*extra repeats, taken while a verdict was noisy or underpowered: 0 of 1 point(s), 0 repeat(s) in all*",
            "undecided where only more sessions can settle it, so no repeat was spent on it: 1 point(s)*",
        ]
    )
    assert "could not have shown a change of their tolerance's size" in output
