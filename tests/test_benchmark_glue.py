"""Load runs as pytest-benchmark entries, checked through inner pytest sessions.

The inner tests feed the real ``benchmark`` fixture with given values, so the JSON, the
storage and ``--benchmark-compare-fail`` are pytest-benchmark's own, not imitations.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.plugin.benchmark import (
    GROUP_UNIT,
    flat_metrics,
    record,
    seconds_per_million_tokens,
)
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.suite.vllm_args import installed_vllm

# A real run of the CPU suite (three repeats), as --qwenperf-json wrote it.
SESSION = Path(__file__).parents[1] / "docs" / "upgrade-gate" / "first.json"

REPEATED = json.loads(SESSION.read_text())["runs"][0]
RUN = REPEATED | {
    "metrics": {"total_token_throughput": 500_000.0, "output_throughput": 250_000.0, "p99_ttft_ms": math.nan, "failed": 0},
    "steady_state": {"total_token_throughput": 520_000.0},
    "server": {"deltas": {"prompt_tokens": 1.0}, "prefix_cache_hit_rate": None},
    "samples": {},
}

INNER = """
import json
from pathlib import Path

from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.plugin.benchmark import record, record_run

SPEC = json.loads(Path("spec.json").read_text())


def test_two_rounds(benchmark):
    params = {"suite": "cpu", "config": "base", "workload": "isl128-osl128"}
    record(benchmark, decode_run(SPEC["run"]), SPEC["seconds"], group="cpu/base", name="isl128-osl128", params=params)


def test_one_run(benchmark):
    record_run(benchmark, decode_run(SPEC["run"]))


def test_repeated_run(benchmark):
    record_run(benchmark, decode_run(SPEC["repeated"]))
"""


def run_inner(pytester: pytest.Pytester, seconds: list[float], *args: str) -> pytest.RunResult:
    (pytester.path / "spec.json").write_text(json.dumps({"run": RUN, "seconds": seconds, "repeated": REPEATED}))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_load=INNER)
    return pytester


def saved_runs(pytester: pytest.Pytester) -> list:
    return sorted((pytester.path / ".benchmarks").glob("*/*.json"))


def test_json_entry_holds_the_given_seconds_and_the_run(inner: pytest.Pytester) -> None:
    result = run_inner(inner, [2.0, 2.2], "--benchmark-json=out.json")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((inner.path / "out.json").read_text())
    entries = {entry["fullname"].split("::")[-1]: entry for entry in report["benchmarks"]}

    two = entries["test_two_rounds"]
    assert (two["group"], two["name"]) == ("cpu/base", "isl128-osl128")
    assert two["params"] == {"suite": "cpu", "config": "base", "workload": "isl128-osl128"}
    assert two["stats"]["data"] == [2.0, 2.2]
    assert (two["stats"]["min"], two["stats"]["max"], two["stats"]["rounds"]) == (2.0, 2.2, 2)
    assert two["stats"]["median"] == pytest.approx(2.1)
    assert two["options"]["timer"] == "qwenperf_measured"
    extra = two["extra_info"]
    assert extra["qwenperf"]["identity"] == RUN["identity"]
    assert extra["qwenperf"]["metrics"]["p99_ttft_ms"] is None, "JSON has no NaN: written as null"
    assert extra["total_token_throughput"] == 500_000.0
    assert extra["steady_state_total_token_throughput"] == 520_000.0
    assert extra["unit"].startswith("seconds per 1,000,000 total tokens")

    one = entries["test_one_run"]  # a run without samples: its single value, one round
    assert (one["group"], one["name"], one["stats"]["data"]) == (f"cpu/base: {GROUP_UNIT}", "isl128-osl128", [2.0])
    assert one["params"] == {"suite": "cpu", "config": "base", "workload": "isl128-osl128"}

    machine = report["machine_info"]
    hw = detect()
    assert (machine["gpu_name"], machine["gpu_count"], machine["cpu_model"]) == (hw.gpu_name, hw.gpu_count, hw.cpu_model)
    assert machine["cpu_count"] == hw.cpu_count
    assert (machine["vllm_distribution"], machine["vllm_version"]) == (installed_vllm() or (None, None))
    assert (machine["driver"], machine["cuda"], machine["kind"], machine["id"]) == (hw.driver, hw.cuda, hw.kind, hw.id)  # the record's spelling


def test_a_run_of_several_repeats_is_one_round_per_repeat(inner: pytest.Pytester) -> None:
    """pytest-benchmark's statistics (and --benchmark-compare-fail) see the run-to-run spread, not one summary value."""
    result = run_inner(inner, [2.0], "--benchmark-json=out.json", "-k", "repeated")
    assert result.ret == 0, result.stdout.str()
    (entry,) = json.loads((inner.path / "out.json").read_text())["benchmarks"]
    throughputs = REPEATED["samples"]["total_token_throughput"]
    assert len(throughputs) == 3
    assert entry["stats"]["rounds"] == len(throughputs)
    assert entry["stats"]["data"] == [1e6 / t for t in throughputs]
    assert entry["stats"]["stddev"] > 0
    assert (entry["group"], entry["name"]) == (f"cpu/base: {GROUP_UNIT}", "isl128-osl128")


def test_compare_fail_on_the_median_gates_throughput(inner: pytest.Pytester) -> None:
    saved = run_inner(inner, [2.0, 2.0], "--benchmark-autosave")
    assert saved.ret == 0, saved.stdout.str()
    assert len(saved_runs(inner)) == 1

    gate = ("--benchmark-compare", "--benchmark-compare-fail=median:5%")
    same = run_inner(inner, [2.0, 2.0], *gate)
    assert same.ret == 0, same.stdout.str()
    assert "DIFFERENT HARDWARE" not in same.stdout.str() + same.stderr.str()

    slower = run_inner(inner, [2.2, 2.2], *gate)  # 10 % more seconds per token: ~9 % less throughput
    assert slower.ret != 0
    output = slower.stdout.str() + slower.stderr.str()
    assert "Performance has regressed" in output
    assert "isl128-osl128 (0001_unversi) - Field 'median' has failed PercentageRegressionCheck" in output


def test_saved_run_from_other_hardware_is_a_loud_warning(inner: pytest.Pytester) -> None:
    assert run_inner(inner, [2.0, 2.0], "--benchmark-autosave").ret == 0
    (path,) = saved_runs(inner)
    data = json.loads(path.read_text())
    data["machine_info"].update(gpu_name="NVIDIA H200", gpu_count=8)
    path.write_text(json.dumps(data))

    result = run_inner(inner, [2.0, 2.0], "--benchmark-compare")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*qwenperf: hardware mismatch*", "*COMPARING ACROSS DIFFERENT HARDWARE*measured on 8x NVIDIA H200*", "*HardwareMismatchWarning*"]
    )

    strict = run_inner(inner, [2.0, 2.0], "--benchmark-compare", "-W", "error::pytest_qwenperf.plugin.benchmark.HardwareMismatchWarning")
    assert strict.ret != 0
    assert "COMPARING ACROSS DIFFERENT HARDWARE" in strict.stdout.str() + strict.stderr.str()


def test_disabled_benchmarks_still_run_the_test_and_skip_skips_it(inner: pytest.Pytester) -> None:
    disabled = run_inner(inner, [2.0], "--benchmark-disable", "--benchmark-json=out.json")
    disabled.assert_outcomes(passed=3)
    assert not (inner.path / "out.json").exists()

    skipped = run_inner(inner, [2.0], "--benchmark-skip")
    skipped.assert_outcomes(skipped=3)


TABLE = """
import json
from pathlib import Path

from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.plugin.benchmark import GROUP_UNIT, record, record_run

SPEC = json.loads(Path("spec.json").read_text())


def test_ours(benchmark):
    record(benchmark, decode_run(SPEC["run"]), SPEC["seconds"], group=f"cpu/base: {GROUP_UNIT}", name="fast", params={})


def test_timed(benchmark):
    benchmark.group = "plain timing"
    benchmark.pedantic(lambda: None, rounds=2, iterations=1)
"""


def test_the_terminal_table_says_its_figures_are_seconds_per_million_tokens(pytester: pytest.Pytester) -> None:
    """Half a second per million tokens stays ``0.5`` under "time in s" and a heading that names the unit,
    where pytest-benchmark would show ``500`` "time in ms"; an ordinary benchmark's table is its own."""
    pytester.makepyfile(test_table=TABLE)
    result = run_inner(pytester, [0.5, 0.6], "--benchmark-json=out.json")
    assert result.ret == 0, result.stdout.str()
    lines = result.stdout.lines
    heading = next(i for i, line in enumerate(lines) if "benchmark 'cpu/base: seconds per million total tokens (lower is better)'" in line)
    assert lines[heading + 1].startswith("Name (time in s) ")
    assert lines[heading + 3].startswith("fast ") and " 0.5000 " in lines[heading + 3], lines[heading + 3]
    plain = next(i for i, line in enumerate(lines) if "benchmark 'plain timing'" in line)
    assert not lines[plain + 1].startswith("Name (time in s) "), lines[plain + 1]  # a no-op is timed in ns or us
    (entry,) = (e for e in json.loads((pytester.path / "out.json").read_text())["benchmarks"] if e["name"] == "fast")
    assert entry["stats"]["data"] == [0.5, 0.6]  # the JSON keeps every round as measured

    asked = run_inner(pytester, [0.5, 0.6], "--benchmark-time-unit=ms", "-k", "ours")
    assert asked.ret == 0, asked.stdout.str()
    asked.stdout.fnmatch_lines(["*benchmark 'cpu/base: seconds per million total tokens*", "Name (time in ms) *", "fast *500.0000*"])


def test_seconds_per_million_tokens() -> None:
    assert seconds_per_million_tokens([500_000.0, 250_000.0]) == [2.0, 4.0]
    for bad in (0.0, None, math.inf):
        with pytest.raises(ValueError, match="no throughput to record"):
            seconds_per_million_tokens([bad])


def test_record_refuses_values_that_are_not_seconds_of_work() -> None:
    with pytest.raises(ValueError, match="cpu/base / w: seconds per unit must be positive and finite"):
        record(object(), decode_run(RUN), [2.0, 0.0], group="cpu/base", name="w", params={})


def test_flat_metrics_name_whole_run_steady_state_and_server_rates() -> None:
    flat = flat_metrics(decode_run(RUN))
    assert flat["output_throughput"] == 250_000.0
    assert flat["steady_state_total_token_throughput"] == 520_000.0
    assert "prefix_cache_hit_rate" in flat and "deltas" not in flat
