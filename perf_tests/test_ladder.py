"""The ladder's ordering: a rung that claims to improve throughput is not slower than its parent.

This is the write-up's ordering (TP=8 < DP=8 < short context < FP8 KV < MTP-1) as a
hardware-independent check: both runs come from the same session on the same machine.
"""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.mark.qwenperf_select("ladder")
def test_rung_not_slower_than_the_one_it_inherits(
    qwenperf_run: Run, qwenperf_measure, qwenperf_suite: Suite, serving_config: ServingConfig, suite_workload: SuiteWorkload
) -> None:
    assert serving_config.inherits is not None
    parent = qwenperf_measure(qwenperf_suite.config(serving_config.inherits), suite_workload)
    metric = "total_token_throughput"
    now, before = qwenperf_run.metrics[metric], parent.metrics[metric]
    ratio = now / before
    assert ratio >= 1 - qwenperf_suite.ladder_tolerance, (
        f"{serving_config.id} ({serving_config.description}) gives {now:.0f} {metric}, "
        f"{1 - ratio:.1%} less than {parent.identity.config} ({before:.0f}); tolerance {qwenperf_suite.ladder_tolerance:.0%}"
    )
