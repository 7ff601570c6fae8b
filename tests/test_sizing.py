"""Sizing the client: the cores a load needs from the client's measured CPU per request and per
chunk (``benchmarks/README.md``, "Client cores per target"), ``qwenperf plan``, and the warning a
bench run whose open loop needs more workers than it has gets before it starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_qwenperf.loadgen.sizing import BUSY_CAP, ClientCost, need
from pytest_qwenperf.serving.server import ManagedServer, ServerSpec
from tests.test_candidate import PACED
from tests.test_cli import run_cli


def test_the_benchmarks_rows_are_what_the_sizing_gives() -> None:
    # 12 B200 nodes of the write-up: 366,667 output tok/s at 512 output tokens a request, one token a chunk
    fleet = need(366_667 / 512, 512)
    assert fleet.busy_cores == pytest.approx(4.76, abs=0.01) and fleet.workers == 10 and fleet.nodes(16) == 1 and fleet.nodes(8) == 2
    # the CPU suite here: 16.6 requests/s of 128 tokens
    assert need(16.6, 128).busy_cores == pytest.approx(0.03, abs=0.005) and need(16.6, 128).workers == 1
    # MTP at full acceptance: two tokens a chunk halve the chunks, not the requests
    two = need(366_667 / 512, 512, tokens_per_chunk=2)
    assert two.chunks_per_s == pytest.approx(fleet.chunks_per_s / 2) and two.workers == 5


def test_each_worker_is_planned_at_most_half_busy() -> None:
    cost = ClientCost(per_request_s=0.0, per_chunk_s=1e-3)
    assert need(1.0, 500, cost=cost).workers == 1  # exactly half a core
    assert need(1.0, 501, cost=cost).workers == 2
    assert BUSY_CAP == 0.5
    with pytest.raises(ValueError, match="tokens_per_chunk: expected at least 1"):
        need(1.0, 10, tokens_per_chunk=0.5)


def test_plan_prints_the_load_what_it_rests_on_and_the_machines() -> None:
    done = run_cli("plan", "--output-throughput", "366667", "--output-len", "512", "--cores-per-node", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "load: 716.1 requests/s, 366,667 streamed chunks/s",
        ("client CPU: 144 µs a request + 12.7 µs a chunk (benchmarks/README.md, 'Client cores per target': paced chunks, "
        "one 2-vCPU AMD EPYC core, 2026-11-27)"),
        "busy client cores: 4.76",
        "client workers: 10 (one a core, each at most 50% busy)",
        "client machines of 8 cores: 2",
    ]
    bad = run_cli("plan", "--request-rate", "10", "--output-len", "64", "--tokens-per-chunk", "0.5")
    assert bad.returncode == 2 and "expected at least 1 token a chunk, got '0.5'" in bad.stderr
    neither = run_cli("plan", "--output-len", "64")
    assert neither.returncode == 2 and "one of the arguments --output-throughput --request-rate is required" in neither.stderr


def test_a_bench_whose_rate_needs_more_workers_is_warned_before_it_runs(tmp_path: Path) -> None:
    spec = ServerSpec(model="standin", launcher=(sys.executable, str(PACED), "--itl-ms", "1"), boot_timeout_s=30, stop_grace_s=2)
    with ManagedServer(spec, tmp_path) as server:
        base = ["bench", "--endpoint", server.base_url, "--progress", "off", "--dataset-name", "fixed", "--prompt", "hello"]
        fast = run_cli(*base, "--output-len", "4096", "--num-prompts", "2", "--request-rate", "100")
        calm = run_cli(*base, "--output-len", "4", "--num-prompts", "2", "--request-rate", "1")
    warning = "qwenperf: warning: 100 requests/s of 4096 output tokens needs about 5.22 busy client cores, 11 workers"
    assert warning in fast.stderr and "--workers is 1: the run may be client-bound" in fast.stderr, fast.stderr
    assert calm.returncode == 0 and "warning" not in calm.stderr, calm.stderr
