"""An operator profile on the real CPU build: ``--qwenperf-profile`` boots the server with vLLM's torch
profiler, and after the point's two measured repeats one more, unmeasured repeat runs between
``/start_profile`` and ``/stop_profile``. Its Chrome trace lies beside the session JSON, its summary in
the run lists operators with positive self time, and the server's own access log shows that every
measured request was sent before the profiler started and none after it stopped.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from pytest_qwenperf.core.run_json import decode_run
from tests.e2e.tiny import inner_session, suite_toml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 4 + 12  # a load run's warm-up and measured requests

SUITE = suite_toml(
    "profile",
    """
[[config]]
id = "tiny"

[[workload]]
name = "isl32-osl16"
kind = "random"
input_len = 32
output_len = 16
num_prompts = 16
warmup = 4
load = { concurrency = 4 }
""",
    suite="repeats = 2",
)


def test_a_profiled_session_keeps_the_trace_beside_its_json_and_measures_only_unprofiled_repeats(pytester: pytest.Pytester) -> None:
    (pytester.path / "suite.toml").write_text(SUITE)
    pytester.makepyfile(test_baseline=(ROOT / "perf_tests" / "test_baseline.py").read_text())

    # Skipped: no baseline to judge against, or (on a busy runner) an invalid run; either way every figure is in the JSON.
    session = inner_session(pytester, "test_baseline.py", "profiled", "--qwenperf-profile", "--qwenperf-no-history", "--qwenperf-allow-invalid")
    session.assert_outcomes(skipped=1)

    (data,) = json.loads((pytester.path / "profiled.json").read_text())["runs"]
    run = decode_run(data, "profiled.json")
    assert run.profile is not None
    assert run.samples is not None and len(run.samples["output_throughput"]) == 2  # the two measured repeats, not the profiled one
    for trace in run.profile.traces:  # relative to the JSON's folder, in the point's folder beside it
        assert trace.startswith("profiled.profiles/profile/tiny/isl32-osl16/") and trace.endswith(".pt.trace.json.gz"), trace
        assert (pytester.path / trace).is_file()
    operators = run.profile.cpu.operators
    assert operators and all(op.self_us > 0 and op.count > 0 for op in operators), operators
    assert run.profile.cpu.total_us >= math.fsum(op.self_us for op in operators) and run.profile.gpu is None
    assert run.profile.stop_s is not None and run.profile.stop_s > 0

    (log,) = (pytester.path / "logs" / "profiled").glob("tiny*.log")
    routes = re.findall(r'"POST (/v1/completions|/start_profile|/stop_profile) HTTP', log.read_text())
    start, stop = routes.index("/start_profile"), routes.index("/stop_profile")
    assert routes[:start] == ["/v1/completions"] * (2 * REQUESTS)  # both measured repeats, all before the profiler started
    assert routes[start + 1 : stop] == ["/v1/completions"] * REQUESTS and routes[stop + 1 :] == []
