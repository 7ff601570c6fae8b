"""A config's warm-up repeats: read from its suite (inherited, checked), planned on its first point,
and run unmeasured once per boot by a session (against a stand-in server, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_qwenperf.suite.config import SuiteError, load_suite
from pytest_qwenperf.suite.cost import plan, points_of
from tests.stream_source import stream_source

SUITE = """\
[suite]
name = "standin"
hardware = "cpu"
model = "embedded:tiny"
repeats = 2

[suite.validity]
retakes = 0   # a retaken load run would send its requests again: the count below must be the repeats'

[[config]]
id = "base"
{warmup}

[[config]]
id = "child"
inherits = "base"

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello world"
output_len = 4
num_prompts = 8
load = {{ concurrency = 2 }}
configs = ["base"]
expected = {{ output_throughput = {{ base = 10.0 }} }}

[[workload]]
name = "w2"
kind = "fixed"
prompt = "hello again"
output_len = 4
num_prompts = 8
load = {{ concurrency = 2 }}
configs = ["base"]
expected = {{ output_throughput = {{ base = 10.0 }} }}
"""


def write_suite(folder: Path, warmup: str) -> Path:
    path = folder / "suite.toml"
    path.write_text(SUITE.format(warmup=warmup))
    return path


def test_a_rung_inherits_its_warmup_repeats_and_a_bad_count_names_the_file_and_field(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path, "warmup_repeats = 1"))
    assert [c.warmup_repeats for c in suite.configs] == [1, 1]
    assert [c.warmup_repeats for c in load_suite(write_suite(tmp_path, "")).configs] == [0, 0]
    path = write_suite(tmp_path, "warmup_repeats = -1")
    with pytest.raises(SuiteError, match=rf"{path}: config 'base'.warmup_repeats: expected a whole number of repeats from 0 to 10, got -1"):
        load_suite(path)


def test_the_plan_counts_the_warmup_repeats_on_each_configs_first_point_only(tmp_path: Path) -> None:
    warmed = load_suite(write_suite(tmp_path, "warmup_repeats = 1"))
    found = plan(warmed, points_of(warmed, ("base",)), {})
    first, second = found.points
    assert (first.warmup_repeats, second.warmup_repeats) == (1, 0)
    assert first.timing is not None and first.planned_s is not None and first.worst_s is not None
    assert first.planned_s == pytest.approx(second.planned_s + first.timing.repeat_s)  # the same work a repeat
    assert first.worst_s == pytest.approx(second.worst_s + first.timing.repeat_s)
    assert first.as_json()["warmup_repeats"] == 1
    unwarmed = load_suite(write_suite(tmp_path, ""))
    assert [p.warmup_repeats for p in plan(unwarmed, points_of(unwarmed, ("base",)), {}).points] == [0, 0]


@pytest.mark.parametrize(("warmup", "sent"), [("", 2 * 2 * 8), ("warmup_repeats = 1", (1 + 2 + 2) * 8)])
def test_a_session_runs_a_configs_warmup_repeats_once_per_boot_and_measures_none_of_them(
    pytester: pytest.Pytester, warmup: str, sent: int
) -> None:
    """Two points on one server: the first sends a warm-up repeat's requests before its own, the second
    none; each run keeps its 2 measured repeats, and the log names the warm-up as not measured."""
    write_suite(pytester.path, warmup)
    pytester.makepyfile(test_baseline=(Path(__file__).parents[1] / "perf_tests" / "test_baseline.py").read_text())
    # Paced tokens: a source that answers at once keeps the client's core busy (a client-bound run).
    with stream_source(model="qwenperf-tiny", default_schedule={"ttft_ms": 20, "itl_ms": 10}) as source:
        result = pytester.runpytest_subprocess(
            "-p",
            "no:cacheprovider",
            "--qwenperf-suite=suite.toml",
            f"--qwenperf-endpoint={source.urls[0]}",
            "--qwenperf-json=results.json",
            "--qwenperf-progress=0",
        )
        requests = source.stats()["requests"]
    output = result.stdout.str() + result.stderr.str()
    runs = json.loads((pytester.path / "results.json").read_text())["runs"]
    assert [(run["identity"]["workload"], len(run["samples"]["output_throughput"])) for run in runs] == [("w", 2), ("w2", 2)], output
    assert requests == sent, output
    assert output.count("warm-up repeat (not measured) done") == (1 if warmup else 0), output
