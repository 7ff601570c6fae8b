"""Tail latency under the workload's SLO (the same SLO syntax as vllm bench serve --goodput)."""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import SuiteWorkload


@pytest.mark.qwenperf_select("slo")
def test_p99_latency_within_slo(qwenperf_run: Run, suite_workload: SuiteWorkload) -> None:
    assert suite_workload.slo is not None
    metrics = qwenperf_run.metrics
    over = {
        f"p99_{key}_ms": (metrics[f"p99_{key}_ms"], limit)
        for key, limit in suite_workload.slo.limits().items()
        if metrics[f"p99_{key}_ms"] > limit
    }
    assert not over, "p99 above the SLO: " + ", ".join(f"{k} {v:.1f} ms > {lim:.0f} ms" for k, (v, lim) in over.items())
