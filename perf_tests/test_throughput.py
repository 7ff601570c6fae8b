"""Throughput floors per rung x workload, on fixed work (ignore_eos, exact lengths)."""

from __future__ import annotations

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload


def test_run_is_complete_and_trustworthy(qwenperf_run: Run) -> None:
    """Every request delivered in full, the client kept up, and client and server agree on tokens."""
    metrics = qwenperf_run.metrics
    assert qwenperf_run.client_bound is None, f"client-bound, not a verdict on vLLM: {qwenperf_run.client_bound}"
    failed = qwenperf_run.failed_requests
    assert failed == 0, f"{failed} request(s) failed over the repeats (the median repeat: {metrics['failed']} of {metrics['completed'] + metrics['failed']})"
    assert qwenperf_run.token_check.matches is not False, qwenperf_run.token_check.detail
    assert metrics["output_throughput"] > 0


def test_throughput_floor(qwenperf_run: Run, serving_config: ServingConfig, suite_workload: SuiteWorkload) -> None:
    metrics = qwenperf_run.metrics
    checked = []
    for name in ("output_throughput", "total_token_throughput", "request_throughput"):
        floor = suite_workload.floor(name, serving_config.id)
        if floor is not None:
            checked.append(name)
            assert metrics[name] >= floor, f"{name} {metrics[name]:.1f} is below the floor {floor:.1f} for {serving_config.key}"
    assert checked, f"no throughput floor for {serving_config.key} on {suite_workload.id} in the suite file"
