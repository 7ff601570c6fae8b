"""Capacity at the SLO: the highest load each rung carries while the p99 of every latency the
workload's SLO limits stays within it (one search per repeat, gated like throughput by
test_baseline.py), above its floor, and rising along the ladder as the suite says it must."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.mark.qwenperf_select("capacity")
def test_capacity_at_slo_is_found_and_above_its_floor(qwenperf_run: Run, serving_config: ServingConfig, suite_workload: SuiteWorkload) -> None:
    assert qwenperf_run.capacity, "a search workload's run carries its searches"
    failed = [search for search in qwenperf_run.capacity if search.load is None]
    assert not failed, (
        f"{serving_config.key}: {failed[0].none_met}"
        + (" (raise the search's max_probes)" if failed[0].bound == "below-probed" else "")
        + f", SLO {failed[0].slo}: "
        + ", ".join(f"{p.load:g}: {p.latencies}" for p in failed[0].probes)
    )
    floor = suite_workload.floor("capacity_at_slo", serving_config.id)
    assert floor is not None, f"no capacity_at_slo floor for {serving_config.key} on {suite_workload.id} in the suite file"
    capacity = qwenperf_run.metrics["capacity_at_slo"]
    assert capacity is not None and capacity >= floor, f"capacity at the SLO {capacity} is below the floor {floor} for {serving_config.key}"


@pytest.mark.qwenperf_select("capacity-order")
def test_capacities_rise_along_the_ladder(
    qwenperf_measure: Callable[[ServingConfig, SuiteWorkload], Run], qwenperf_suite: Suite, suite_workload: SuiteWorkload
) -> None:
    """Each config of ``capacity_order`` carries more than the one before it (``capacity_relation =
    "not-below"``: at least as much, short of it by no more than the search's resolution), and at
    least its factor times the first where one is given (the median of each config's searches)."""
    capacities = []
    for config_id, factor in suite_workload.capacity_order:
        run = qwenperf_measure(qwenperf_suite.config(config_id), suite_workload)
        found = [s.load for s in run.capacity if s.load is not None]
        assert found, f"{config_id}: no search found a capacity at the SLO"
        capacities.append((config_id, factor, statistics.median(found)))
    every = ", ".join(f"{c} {v:.3g}" for c, _, v in capacities)
    first, _, base = capacities[0]
    assert suite_workload.search is not None, "a capacity_order needs a search"
    highest, resolution = suite_workload.search.highest, suite_workload.search.resolution
    for (below, _, low), (above, factor, high) in itertools.pairwise(capacities):
        assert low != highest, (
            f"{below}'s capacity at the SLO is the highest load searched ({highest:g}): the search cannot show that "
            f"{above} carries more; raise the search's highest load for this runner (in order: {every})"
        )
        if suite_workload.capacity_relation == "above":
            assert high > low, f"{above}'s capacity at the SLO {high:.3g} is not above {below}'s {low:.3g} (in order: {every})"
        else:
            assert high >= low * (1 - resolution), (
                f"{above}'s capacity at the SLO {high:.3g} is below {below}'s {low:.3g} by more than the search's resolution "
                f"({resolution:.0%}; in order: {every})"
            )
        assert high >= base * factor, f"{above}'s capacity at the SLO {high:.3g} is not {factor:g}x {first}'s {base:.3g} (in order: {every})"
