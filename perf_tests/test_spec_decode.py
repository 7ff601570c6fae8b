"""Speculative decoding: acceptance from the server's counters above the suite's floors.

Dummy or random weights make acceptance meaningless for model-based drafts (MTP, EAGLE):
GPU suites run those rungs on the real checkpoint.
"""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload


@pytest.mark.qwenperf_select("speculative")
def test_acceptance_above_floor(qwenperf_run: Run, serving_config: ServingConfig, suite_workload: SuiteWorkload) -> None:
    observed = {
        "spec_decode_acceptance_rate": qwenperf_run.server.spec_decode_acceptance_rate,
        "spec_decode_mean_acceptance_length": qwenperf_run.server.spec_decode_mean_acceptance_length,
    }
    assert all(v is not None for v in observed.values()), f"no drafts counted by the server: {qwenperf_run.server.deltas}"
    floors = {name: suite_workload.floor(name, serving_config.id) for name in observed}
    assert any(f is not None for f in floors.values()), f"no acceptance floor for {serving_config.key} in the suite file"
    for name, floor in floors.items():
        if floor is not None:
            assert observed[name] >= floor, f"{name} {observed[name]:.3f} is below the floor {floor}"
