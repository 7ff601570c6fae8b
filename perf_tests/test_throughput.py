"""Throughput floors per rung x workload, on fixed work (ignore_eos, exact lengths)."""

from __future__ import annotations

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload


def test_run_is_complete_and_trustworthy(qwenperf_run: Run) -> None:
    """Every request delivered in full, the client kept up, client and server agree on tokens,
    and the device's conditions were right (no other busy process on the server's cores, no
    GPU clock event, XID or ECC error, no other process's memory on its GPUs): a run that
    fails any of these is ``invalid``, no verdict on vLLM either way."""
    metrics = qwenperf_run.metrics
    found = losses(qwenperf_run)
    assert not found, "invalid, not a verdict on vLLM: " + "; ".join(f"{loss.reason}: {loss.detail}" for loss in found)
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
