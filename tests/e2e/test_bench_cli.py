"""``qwenperf bench`` as a user runs it: a subprocess against a real vLLM server (CPU build, tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.serving.server import ManagedServer
from tests.e2e.tiny import TINY

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])]


def bench(server: ManagedServer, *args: str) -> subprocess.CompletedProcess[str]:
    cpus = sorted(os.sched_getaffinity(0))
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", server.base_url, "--progress", "off"]
    argv += ["--client-cpus", str(cpus[-1])]
    return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=300, check=False)


def test_bench_writes_vllm_keys_versions_and_per_request_records(vllm_server: ManagedServer, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    workload = ["--input-len", "64", "--output-len", "32", "--num-prompts", "40", "--max-concurrency", "8", "--warmup", "4"]
    store = tmp_path / "history.sqlite"
    done = bench(vllm_server, *workload, "--json", str(out), "--detailed", "--history", str(store))
    assert done.returncode == 0, done.stderr
    assert f"result recorded in the history store {store}" in done.stdout
    assert "Output token throughput (tok/s)" in done.stdout
    result = json.loads(out.read_text())
    metrics = result["metrics"]
    assert (metrics["completed"], metrics["failed"]) == (40, 0)  # --num-prompts counts measured requests, as in vLLM
    assert (metrics["total_input_tokens"], metrics["total_output_tokens"]) == (40 * 64, 40 * 32)
    for key in ("output_throughput", "total_token_throughput", "request_throughput", "p99_ttft_ms", "median_tpot_ms", "p90_itl_ms", "mean_e2el_ms"):
        assert metrics[key] > 0, key
    # The first-request check happens before the counters are read: they moved by warm-up + measured requests only.
    assert result["token_check"]["matches"] is True, result["token_check"]["detail"]
    assert result["context"]["vllm_version"] == vllm_server.info[0].version
    assert result["identity"]["workload"] == "random-isl64-osl32"
    requests = result["requests"]
    assert len(requests) == 40
    for r in requests:
        assert r["ok"] and r["output_tokens"] == 32 and r["input_tokens"] == 64
        assert len(r["itl_ms"]) == 31 and r["ttft_ms"] > 0 and r["start"] < r["end"]
        # The stream ends after its last token: soon after (how soon is the server's and the machine's load; a second is
        # far beyond either), and never before (TTFT and the gaps are measured from the request's start).
        assert -1e-6 < (r["end"] - r["start"]) * 1000 - (r["ttft_ms"] + sum(r["itl_ms"])) < 1000

    with HistoryStore.open(store) as history:  # the store holds the run as the file does
        (recorded,) = [history.series(key) for key in history.keys(metric="output_throughput")]
        assert [p.values for p in recorded] == [(metrics["output_throughput"],)]
        assert history.run(recorded[0].run_key).context.vllm_version == vllm_server.info[0].version

    again = bench(vllm_server, *workload, "--json", str(out))
    assert again.returncode == 2 and "exists" in again.stderr
    assert json.loads(out.read_text()) == result  # the earlier result is untouched


def test_bench_refuses_requests_longer_than_max_model_len(vllm_server: ManagedServer) -> None:
    done = bench(vllm_server, "--input-len", "2000", "--output-len", "100", "--num-prompts", "4")
    assert done.returncode == 2
    assert "2000 input + 100 output tokens = 2100, more than the server's max_model_len 2048" in done.stderr


def test_bench_shows_the_servers_own_message_for_a_rejected_request(vllm_server: ManagedServer) -> None:
    """Chat prompts are not length-checked locally (the chat template adds tokens): the server's 400 stops the run."""
    long_text = "tell me more " * 1000
    done = bench(vllm_server, "--endpoint-type", "chat", "--dataset-name", "fixed", "--prompt", long_text, "--output-len", "16")
    assert done.returncode == 2
    assert "the first request to" in done.stderr and "failed (HTTP 400)" in done.stderr
    assert "maximum context length" in done.stderr or "max_model_len" in done.stderr or "too long" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "no-such-model"), "/v1/models lists ['qwenperf-tiny'], not 'no-such-model'"),
        (("--dataset-name", "jsonl", "--dataset-path", "/no/such/file.jsonl"), "/no/such/file.jsonl"),
        (("--dataset-name", "fixed"), "--dataset-name fixed needs --prompt TEXT"),
    ],
)
def test_bench_input_errors_are_clear(vllm_server: ManagedServer, args: tuple[str, ...], message: str) -> None:
    done = bench(vllm_server, *args, "--num-prompts", "2")
    assert done.returncode == 2
    assert message in done.stderr

