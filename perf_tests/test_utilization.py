"""Is the device busy? The write-up's finding: without MTP the GPUs sat idle while loaded.

Mean utilization over the run's steady-state window must reach the suite's floor:
``gpu_utilization`` (mean over the config's GPUs, NVML) on GPU suites, ``server_cpu_busy``
(cores the server's process tree kept busy, psutil) on the CPU build, where the CPU is
the device. Tokens per joule is gated against the baseline by test_baseline.py.
"""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.mark.qwenperf_select("utilization")
def test_device_busy_in_steady_state(
    qwenperf_run: Run, qwenperf_suite: Suite, serving_config: ServingConfig, suite_workload: SuiteWorkload
) -> None:
    telemetry = qwenperf_run.telemetry or {}
    if qwenperf_suite.gpus:
        name, sampler, what = "gpu_utilization", "gpu", "GPU utilization"
    else:
        name, sampler, what = "server_cpu_busy", "cpu", "server CPU"
    observed = qwenperf_run.value(name)
    assert observed is not None, f"no {what} sampled: {telemetry.get(sampler)}"
    floor = suite_workload.floor(name, serving_config.id)
    assert floor is not None, f"no {name} floor for {serving_config.key} on {suite_workload.id} in {qwenperf_suite.path}"
    assert observed >= floor, f"{name} {observed:.2f} is below the floor {floor} for {serving_config.key}: the device sat idle"
