"""A session whose server shares its core with another busy process: the perf suite's own
validity test fails naming ``cpu-contention`` and the competitor; with
``--qwenperf-allow-invalid`` every test of the run is skipped with the reason, never passed.

The server is a paced stand-in launcher (tests/standins/paced_vllm.py, a real process the plugin
boots and pins like vLLM); the competitor is detached from this test's process tree, so it is
neither the server's nor the load generator's. The same path on real vLLM is
tests/e2e/test_validity.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.validity import competitor
from tests.test_candidate import paced

ROOT = Path(__file__).resolve().parents[1]
SUITE = """\
[suite]
name = "standin"
hardware = "cpu"
model = "embedded:tiny"
repeats = 1

[suite.validity]
retakes = 0  # the competitor stays: a retake would only take longer (tests/test_retake.py has them)

[[config]]
id = "base"

[[workload]]
name = "w"
kind = "fixed"
prompt = "hello world"
output_len = 64
num_prompts = 64
load = { concurrency = 4 }
"""

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the server and one for the client")


def contended_session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, list[int]]:
    """The perf suite's validity and baseline tests against a stand-in whose core another process keeps busy."""
    (pytester.path / "suite.toml").write_text(SUITE)
    pytester.makepyfile(
        test_throughput=(ROOT / "perf_tests" / "test_throughput.py").read_text(),
        test_baseline=(ROOT / "perf_tests" / "test_baseline.py").read_text(),
    )
    server_cpus = frozenset(sorted(os.sched_getaffinity(0))[:-1])  # the plugin's placement: all but the last
    with competitor(server_cpus, lasts_s=300) as spinners:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-k", "complete or regression", "--qwenperf-suite=suite.toml", f"--qwenperf-launcher={paced(5)}", *args
        )
    return result, spinners


def test_a_session_sharing_the_servers_core_fails_as_invalid_naming_the_competitor(pytester: pytest.Pytester) -> None:
    result, spinners = contended_session(pytester)
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    result.assert_outcomes(failed=2)
    assert "invalid, not a verdict on vLLM: cpu-contention: the run's server core" in output
    # The baseline test names why the run is invalid: nothing was lost here, the core was shared.
    assert "the run is invalid (cpu-contention), so its numbers are no verdict on vLLM" in output
    assert any(f"pid {pid} " in output for pid in spinners), output
    assert "INVALID: cpu-contention" in output  # the session's table


@pytest.mark.parametrize("how", ["option", "ini"])
def test_allowed_an_invalid_run_skips_its_tests_with_the_reason_and_never_passes(pytester: pytest.Pytester, how: str) -> None:
    if how == "ini":
        pytester.makeini("[pytest]\nqwenperf_allow_invalid = true\n")
    result, _ = contended_session(pytester, "-rs", *(["--qwenperf-allow-invalid"] if how == "option" else []))
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*invalid, not a verdict on vLLM (--qwenperf-allow-invalid): cpu-contention: the run's server core*"])
