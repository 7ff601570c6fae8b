"""Run validity on the real CPU build: a busy process on the server's core makes the run invalid.

The competitor is what a shared runner has: a process that is not the server's and not the
load generator's (it is detached from this test's process tree), spinning on the server's
core while the load runs. The run it slows must come out ``invalid: cpu-contention``, naming
the competitor, and never ``regression`` against a baseline it is far slower than.
"""

from __future__ import annotations

import os

import msgspec
import psutil
import pytest

from benchmarks.validity import competitor
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.gate.baseline import baseline_from_run
from pytest_qwenperf.gate.judge import judge_run
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.run import measure
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import SuiteWorkload
from pytest_qwenperf.suite.workloads import RandomWorkload
from tests.e2e.tiny import TINY

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])]

WORKLOAD = SuiteWorkload(RandomWorkload(input_len=64, output_len=64, num_prompts=96), ClosedLoop(16), warmup=16)
def test_a_busy_process_on_the_servers_core_makes_the_run_invalid_not_a_regression(vllm_server: Server) -> None:
    server_cpus = frozenset(os.sched_getaffinity(vllm_server.pids[0]))
    client_cpus = frozenset(os.sched_getaffinity(0)) - server_cpus
    assert client_cpus, f"the server was placed on every CPU ({sorted(server_cpus)}): nothing left to pin the client to"
    with competitor(server_cpus, lasts_s=300) as spinners:  # ends by itself even if this test is killed
        assert all(psutil.Process(pid).ppid() != os.getpid() for pid in spinners)
        # No retake: the competitor stays, so one would only take longer (tests/test_retake.py has them).
        method = Method(plan=repeats(3), client=ClientSetup(cpus=client_cpus), validity=ValidityLimits(retakes=0))
        run = measure(vllm_server, TINY, WORKLOAD, method)

    reasons = {loss.reason: loss.detail for loss in run.conditions}
    assert "cpu-contention" in reasons, run.telemetry
    assert any(f"pid {pid} " in reasons["cpu-contention"] for pid in spinners), reasons["cpu-contention"]

    # A baseline twice as fast, with the same spread: by the numbers alone a clear regression.
    faster = {name: tuple(2 * v for v in values if v is not None) for name, values in (run.samples or {}).items()}
    baseline = baseline_from_run(msgspec.structs.replace(run, samples=faster, conditions=()), source="test")
    judgements = judge_run(baseline, run)
    assert judgements and all(j.verdict == "invalid" and "cpu-contention" in j.reason for j in judgements), [j.label for j in judgements]
