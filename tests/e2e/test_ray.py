"""Client workers on a real Ray cluster of two nodes (a head and a second raylet, both on this
machine: ``tests/ray_cluster.py``) driving a real vLLM (CPU build, tiny model) through
``qwenperf bench --ray``, as a user runs it.

The run's workers are spread over both nodes and their records merged on the driver's clock: the
token totals equal the server's ``/metrics`` deltas exactly, and on one machine, where every
process reads the same monotonic clock, each measured offset is within half its round trip. A
worker actor killed mid-run fails the run, naming it (index, node address, pid), and no actor of
the run is left on any node, nor when the driver itself is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_qwenperf.serving.server import ManagedServer
from tests.e2e.tiny import TINY
from tests.ray_cluster import RayCluster, ray_processes, start_ray_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])]

WORKER = "ray::ClientWorker"
"""How Ray titles a client worker's process (``ray::<actor class>.<method>`` while it runs one)."""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    cluster = start_ray_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not ray_processes(), "a Ray process outlived the cluster's stop"


def bench_argv(server: ManagedServer, cluster: RayCluster, *args: str) -> list[str]:
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", server.base_url, "--progress", "off"]
    return [*argv, "--ray", cluster.address, "--workers", "2", *args]


def workers() -> list[psutil.Process]:
    """The client workers' processes that are alive (a zombie has ended)."""
    found = psutil.process_iter(["cmdline", "status"])
    return [p for p in found if WORKER in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE]


def none_left(timeout_s: float = 30.0) -> list[psutil.Process]:
    """The client workers still running once ``timeout_s`` has passed (or at once, when none is)."""
    deadline = time.monotonic() + timeout_s
    while (left := workers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_workers_on_two_nodes_merge_exactly_on_the_drivers_clock(vllm_server: ManagedServer, ray_cluster: RayCluster, tmp_path: Path) -> None:
    out = tmp_path / "ray.json"
    workload = ["--input-len", "32", "--output-len", "32", "--num-prompts", "96", "--max-concurrency", "8", "--warmup", "8"]
    argv = bench_argv(vllm_server, ray_cluster, *workload, "--json", str(out), "--detailed")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["token_check"]["matches"] is True, result["token_check"]["detail"]
    metrics = result["metrics"]
    assert (metrics["completed"], metrics["failed"]) == (96, 0)
    assert (metrics["total_input_tokens"], metrics["total_output_tokens"]) == (96 * 32, 96 * 32)
    clocks = result["context"]["worker_clocks"]
    assert [c["worker"] for c in clocks] == [0, 1] and result["context"]["workers"] == 2
    assert len({c["node"] for c in clocks}) == 2, clocks  # SPREAD: one worker on each raylet
    for clock in clocks:  # one machine, one monotonic clock: the true offset is 0, known to within half the round trip
        assert abs(clock["offset_s"]) <= clock["round_trip_s"] / 2 + 1e-4, clock
        assert clock["pid"] != os.getpid() and clock["address"] == clocks[0]["address"]  # one machine
    starts = [r["start"] for r in result["requests"]]
    assert starts == sorted(starts)  # merged in send order on one time base
    assert not none_left()


LONG_RUN = ["--input-len", "32", "--output-len", "32", "--num-prompts", "600", "--request-rate", "20", "--warmup", "4"]
"""A 30 s open loop: long enough to kill something in the middle of it."""


def running_workers(run: subprocess.Popen[str]) -> list[psutil.Process]:
    """Both client workers once they run the load (an empty list if the driver ended first)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None:
        running = [p for p in workers() if f"{WORKER}.run" in " ".join(p.cmdline())]
        if len(running) == 2:
            time.sleep(3.0)  # well into the run
            return running
        time.sleep(0.2)
    return []


def test_a_worker_killed_mid_run_fails_the_run_naming_it_and_leaves_no_worker(
    vllm_server: ManagedServer, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    run = subprocess.Popen(bench_argv(vllm_server, ray_cluster, *LONG_RUN), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        running = running_workers(run)
        assert len(running) == 2, "both workers should be running the load"
        victim = running[0].pid
        os.kill(victim, signal.SIGKILL)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, out + err
    assert f"pid {victim}) was lost during the run" in err and "client worker " in err and "no result written" in err, err
    assert not none_left(), "the other worker should have been stopped"


def test_a_driver_killed_mid_run_leaves_no_worker_on_any_node(vllm_server: ManagedServer, ray_cluster: RayCluster) -> None:
    """SIGKILL gives the driver no chance to stop its workers: Ray does, as the actors' owner is gone."""
    run = subprocess.Popen(bench_argv(vllm_server, ray_cluster, *LONG_RUN), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        running = running_workers(run)
        assert len(running) == 2, "both workers should be running the load"
        run.kill()
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == -signal.SIGKILL
    left = none_left(60.0)
    assert not left, f"client workers outlived their driver: {[p.pid for p in left]}"
