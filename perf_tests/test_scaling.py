"""Scaling efficiency: N replicas under N× the load against one replica under the load once.

The write-up's headline: DP=8 replicas per node and 96.5 % scaling efficiency over 12
nodes with plain round-robin. Runs on configs with ``replicas = N`` (booted here, each on
its own slice of the machine), or, with ``--qwenperf-endpoints-file``, on replicas
already deployed on several nodes. The efficiency of each replica count is in the run's
``scaling`` block of ``--qwenperf-json`` and gated as ``scaling_efficiency_n<N>``: against
the suite's floor and the stored baseline.
"""

from __future__ import annotations

import statistics

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.judge import render_judgements
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload

pytestmark = [pytest.mark.scaling, pytest.mark.qwenperf_select("scaling")]

SPREAD_LIMIT = 0.10
"""Each replica's request count within 10 % of the mean: the router spreads the load."""


def test_requests_spread_evenly_over_replicas(qwenperf_run: Run) -> None:
    scaling = qwenperf_run.scaling
    assert scaling is not None, "no scaling figures: the run compared no replica counts"
    counts = dict(scaling.requests_per_replica)
    spread = scaling.request_spread
    if spread is None and not counts:
        pytest.skip("the endpoints are a Service or gateway in front of the replicas: requests per replica are not visible")
    assert spread is not None, f"a replica's /metrics had no request counter: {counts}"
    assert spread <= SPREAD_LIMIT, f"requests per replica {counts}: {spread:.1%} from the mean, more than {SPREAD_LIMIT:.0%}"


def test_scaling_efficiency(
    qwenperf_run: Run,
    qwenperf_judgements: tuple[Judgement, ...],
    serving_config: ServingConfig,
    suite_workload: SuiteWorkload,
) -> None:
    """Every replica count's median efficiency reaches the suite's floor, and none regresses against the baseline."""
    scaling = qwenperf_run.scaling
    assert scaling is not None, "no scaling figures: the run compared no replica counts"
    efficiencies = scaling.efficiencies()
    assert efficiencies, f"only the one-replica reference was measured: {scaling.replicas}"
    judged = [j for j in qwenperf_judgements if j.metric.startswith("scaling_efficiency_n")]
    floors = {n: suite_workload.floor(f"scaling_efficiency_n{n}", serving_config.id) for n in efficiencies}
    assert any(f is not None for f in floors.values()) or any(j.verdict != "no-baseline" for j in judged), (
        f"nothing to gate scaling efficiency with: no floor scaling_efficiency_n<N> for {serving_config.key} "
        f"on {suite_workload.id} in the suite file and no stored baseline"
    )
    for n, values in efficiencies.items():
        floor = floors[n]
        if floor is not None:
            median = statistics.median(values)
            assert median >= floor, f"scaling efficiency at {n} replicas {median:.3f} (repeats {values}) is below the floor {floor}"
    regressions = [j for j in judged if j.verdict == "regression"]
    assert not regressions, f"scaling efficiency regressed against the baseline\n{render_judgements(judged)}"
