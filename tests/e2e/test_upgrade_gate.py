"""The upgrade gate on the real CPU build: a red exit on a slow server.

Two sessions' worth of runs against one tiny-model server, each written as the session JSON
``--qwenperf-json`` writes and judged by the ``qwenperf compare`` command line with the CPU
suite's tolerances: a session during which the server is deliberately slowed must be flagged
``regression`` (exit 1) against a plain one.

Whether two plain sessions pass depends on the runner, so it is measured, not asserted here:
``benchmarks/gate_power.py`` counts the false alarms of A/A pairs (docs/gate-power.md). On a
2-vCPU AMD EPYC runner (2026-11-26) two consecutive plain sessions differed by 22 % in
throughput and 25 % in tokens per server CPU-second while each session's repeats agreed
within 1.5 %: a difference between sessions that the repeats of one cannot show.

The slowdown: four busy loops pinned to each of the server's cores, each in a
session of its own, so the server gets a fifth of its core where the kernel schedules by
session (autogroup) and at most a third where it schedules by process (its API server and
engine core against four loops). Its throughput falls to a third or less, far beyond the
25 % the suite tolerates, whichever way this machine's scheduler splits a core (one loop in
the test's own session left the server half its core with autogroup, and two thirds
without: too close to the tolerance to be a verdict every time). The config, and so the
identity, stays the same: what a slower vLLM release looks like to the gate.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_qwenperf.gate.compare import compare, load_runs
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.run import measure, reset_prefix_caches
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import SuiteWorkload, load_suite
from pytest_qwenperf.suite.workloads import RandomWorkload
from pytest_qwenperf.telemetry.server_metrics import counter_deltas, scrape
from tests.e2e.tiny import TINY, stream_completion
from tests.processes import busy_loops

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])]

ROOT = Path(__file__).resolve().parents[2]
CPU_SUITE = load_suite(ROOT / "perf_tests" / "suites" / "cpu.toml")
# Smaller than the suite's throughput point (about 4 s a run here), the same shape.
WORKLOAD = SuiteWorkload(RandomWorkload(input_len=64, output_len=64, num_prompts=160), ClosedLoop(32), warmup=32)


def session_json(server: Server, path: Path, client_cpus: frozenset[int]) -> Path:
    result = measure(server, TINY, WORKLOAD, Method.of(CPU_SUITE, repeats(3), ClientSetup(cpus=client_cpus)))
    report = SessionReport()
    report.add(result)
    assert report.write_json(path) is None  # a fresh path: nothing was set aside
    return path


def qwenperf_compare(*files: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "compare", *map(str, files), "--fail-on", "regression"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_a_slowed_server_is_a_regression(vllm_server: Server, tmp_path: Path) -> None:
    server_cpus = frozenset(os.sched_getaffinity(vllm_server.pids[0]))
    client_cpus = frozenset(os.sched_getaffinity(0)) - server_cpus
    plain = session_json(vllm_server, tmp_path / "plain.json", client_cpus)
    with busy_loops(server_cpus, per_cpu=4, own_sessions=True):
        slowed = session_json(vllm_server, tmp_path / "slowed.json", client_cpus)

    gated = qwenperf_compare(plain, slowed)
    assert gated.returncode == 1, f"the slowed server was not flagged:\n{gated.stdout}{gated.stderr}"
    judgements = {j.metric: j for _, _, j in compare([load_runs(plain), load_runs(slowed)]).judgements()}
    throughput = judgements["total_token_throughput"]
    assert throughput.verdict == "regression", throughput
    assert throughput.ratio is not None and throughput.ratio < 1 - CPU_SUITE.tolerances["total_token_throughput"]


def test_each_repeat_starts_with_an_empty_prefix_cache(vllm_server: Server) -> None:
    """measure() resets the cache before each repeat; without it a repeat hits on the last one's prompts."""
    prompt = "the same long prompt, word after word, " * 12

    def hits_of_one_request() -> float:
        before = scrape(vllm_server.base_urls)
        asyncio.run(stream_completion(vllm_server.base_url, vllm_server.model, prompt, 2))
        return counter_deltas(before, scrape(vllm_server.base_urls))["prefix_cache_hits"] or 0.0

    hits_of_one_request()
    assert hits_of_one_request() > 0  # the second identical request hits: the cache is on
    assert reset_prefix_caches(vllm_server.base_urls)
    assert hits_of_one_request() == 0
