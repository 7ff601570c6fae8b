"""Two real CPU-build replicas: booted together, sharing the load, scaling measured and gated,
a replica lost mid-run named, and the nginx route end to end."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.gate.baseline import load_baseline, write_baseline
from pytest_qwenperf.gate.judge import judge_run
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.run import measure
from pytest_qwenperf.serving import proctree
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.replicas import ReplicaSet, replica_specs
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER, ServerError
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload
from pytest_qwenperf.suite.workloads import RandomWorkload
from tests.e2e.tiny import TINY

pytestmark = pytest.mark.e2e

PAIR = dataclasses.replace(TINY, id="e2e-pair", replicas=2)
# One replica's load: 48 requests (8 of them warm-up) at concurrency 8; two replicas get twice that.
WORKLOAD = SuiteWorkload(RandomWorkload(input_len=64, output_len=32, num_prompts=48), ClosedLoop(8), warmup=8)


def pair(config: ServingConfig, log_dir: Path) -> ReplicaSet:
    """Two replicas of ``config``, one core each (on a 2-core machine the client shares them)."""
    cpus = frozenset(sorted(os.sched_getaffinity(0))[:2])
    spec = server_spec(config, launcher=DEFAULT_LAUNCHER, boot_timeout_s=600, cpus=cpus)
    return ReplicaSet(config.id, replica_specs(spec, 2), log_dir, routing=config.routing)


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    yield
    assert proctree.tagged_processes(proctree.owner_prefix()) == [], "a replica or router process outlived its set"


def test_two_replicas_share_the_load_and_their_scaling_is_reported_and_gated(tmp_path: Path, no_leftovers: None) -> None:
    with pair(PAIR, tmp_path) as replicas:
        assert len(set(replicas.pids)) == 2 and len(set(replicas.base_urls)) == 2
        assert [r.spec.cpus for r in replicas.replicas] == [frozenset({c}) for c in sorted(os.sched_getaffinity(0))[:2]]
        assert sorted(p.name for p in tmp_path.glob("*.log")) == ["e2e-pair-r0.log", "e2e-pair-r1.log"]
        result = measure(replicas, PAIR, WORKLOAD, Method(suite="e2e", plan=repeats(2)))

    assert result.metrics["completed"] == 80 and result.metrics["failed"] == 0  # two replicas' load, warm-up excluded
    assert result.token_check.matches, result.token_check.detail
    # Round-robin over interleaved copies: each replica finished exactly one copy (48 requests).
    assert sorted(result.requests_per_server.values()) == [48, 48]
    scaling, samples = result.scaling, result.samples or {}
    assert scaling is not None and set(scaling.replicas) == {"1", "2"} and scaling.request_spread == 0
    # Each repeat's two-replica throughput over twice its one-replica reference. How far that is from 1
    # is this machine's (two replicas and the client share two cores, and other load shifts it either way).
    one, two = scaling.replicas["1"].throughput, scaling.replicas["2"].throughput
    assert two == samples["total_token_throughput"] and len(one) == 2 and min(one + two) > 0
    efficiencies = scaling.replicas["2"].efficiency or ()
    assert list(efficiencies) == pytest.approx([t2 / (2 * t1) for t1, t2 in zip(one, two, strict=True)]), (one, two, efficiencies)
    assert samples["scaling_efficiency_n2"] == efficiencies

    # Gated like every baseline metric: recorded, then a run that scales like one replica doing
    # all the work (efficiency halved; what a router sending everything to one replica gives).
    path = write_baseline(tmp_path / "baselines", result, source="test")
    worse = msgspec.structs.replace(result, samples={**samples, "scaling_efficiency_n2": tuple(e * 0.5 for e in efficiencies)})
    judged = {j.metric: j for j in judge_run(load_baseline(path), worse)}
    scaled = judged["scaling_efficiency_n2"]
    assert scaled.ratio == pytest.approx(0.5)
    # Two repeats on two shared cores may be too spread for a verdict: then it says noisy, never pass.
    # (That a change beyond tolerance and noise is always a regression is tests/test_verdict.py's.)
    assert scaled.verdict in ("regression", "noisy"), scaled
    assert judged["total_token_throughput"].ratio == 1.0 and judged["total_token_throughput"].verdict != "regression"


def test_a_replica_killed_mid_run_fails_the_run_naming_it(tmp_path: Path, no_leftovers: None) -> None:
    longer = dataclasses.replace(WORKLOAD, workload=dataclasses.replace(WORKLOAD.workload, num_prompts=400))
    with pair(PAIR, tmp_path) as replicas:
        victim = replicas.replicas[1]
        assert victim.pid is not None
        killer = threading.Timer(2.0, os.kill, (victim.pid, signal.SIGKILL))  # the API server only: its engine is orphaned
        killer.start()
        try:
            with pytest.raises(ServerError) as failure:
                measure(replicas, PAIR, longer, Method(suite="e2e"))
        finally:
            killer.cancel()
    message = str(failure.value)
    assert "e2e-pair-r1" in message and "e2e-pair-r0" not in message, message
    assert f"exit code {-signal.SIGKILL}" in message and str(victim.log_path) in message


def test_the_nginx_route_spreads_the_load_end_to_end(tmp_path: Path, nginx: str, no_leftovers: None) -> None:
    behind_nginx = dataclasses.replace(PAIR, id="e2e-nginx", routing="nginx")
    with pair(behind_nginx, tmp_path) as replicas:
        assert replicas.router is not None
        assert replicas.load_urls == (replicas.router.base_url,) and replicas.router.base_url not in replicas.base_urls
        result = measure(replicas, behind_nginx, WORKLOAD, Method(suite="e2e"))
        served = result.requests_per_server
        # What nginx says it sent each replica is what each replica says it finished (plus readiness probes).
        # nginx logs a request when it is done with the connection, which can be a moment after the client is.
        deadline = time.monotonic() + 30
        while not all((routed := replicas.router.requests_per_upstream()).get(url, 0) >= n for url, n in served.items()):
            assert time.monotonic() < deadline, (routed, served)
            time.sleep(0.05)

    assert result.metrics["failed"] == 0
    assert result.token_check.matches, result.token_check.detail  # /metrics read from the replicas, not through nginx
    assert sum(served.values()) == 96 and all(count > 0 for count in served.values()), served
    # How even the spread is follows the replicas' speeds (least_conn favours a replica whose core is less
    # busy), which is this machine's load: the figure must only be the served counts'.
    assert result.scaling is not None
    assert result.scaling.request_spread == pytest.approx(abs(next(iter(served.values())) - 48) / 48), served
