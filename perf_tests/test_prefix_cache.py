"""Prefix caching on a shared-prefix workload: hit rate from the server's counters, and TTFT gain."""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.mark.qwenperf_select("prefix-cache")
def test_prefix_cache_hits_and_cuts_ttft(
    qwenperf_run: Run, qwenperf_measure, qwenperf_suite: Suite, serving_config: ServingConfig, suite_workload: SuiteWorkload
) -> None:
    hit_rate = qwenperf_run.server.prefix_cache_hit_rate
    floor = suite_workload.floor("prefix_cache_hit_rate", serving_config.id)
    assert hit_rate is not None, "the server exposed no prefix-cache counters"
    assert floor is not None, f"no prefix_cache_hit_rate floor for {serving_config.key} in the suite file"
    assert hit_rate >= floor, f"prefix-cache hit rate {hit_rate:.1%} is below {floor:.0%}"

    assert serving_config.inherits is not None
    uncached = qwenperf_measure(qwenperf_suite.config(serving_config.inherits), suite_workload)
    with_cache, without = qwenperf_run.metrics["mean_ttft_ms"], uncached.metrics["mean_ttft_ms"]
    assert with_cache < without, f"mean TTFT {with_cache:.1f} ms with the cache, {without:.1f} ms without"
