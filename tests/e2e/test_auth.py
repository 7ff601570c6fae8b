"""A real vLLM (CPU build) that requires an API key: the plugin and ``qwenperf bench`` succeed with the
key from the environment, and the key is in no file either wrote and in no line either printed.

One boot: an inner pytest session with ``VLLM_API_KEY`` set boots the tiny model for a one-config
suite, measures it (session JSON, baselines, pytest-benchmark JSON, server log), and while the
server runs shows that vLLM refuses a request without the key and that ``qwenperf bench`` gets
through with it. Then every file under the session's folder (its HOME too, so vLLM's own cache
and config folders are in it: compiled graphs, hashes of config factors, usage stats), under the
inner session's temporary folder, and the session's output are searched for the key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from tests.e2e.tiny import suite_toml

pytestmark = pytest.mark.e2e

SUITE = suite_toml(
    "auth",
    """
[[config]]
id = "keyed"

[[workload]]
name = "isl64-osl32"
kind = "random"
input_len = 64
output_len = 32
num_prompts = 28
warmup = 4
load = { concurrency = 8 }
configs = ["keyed"]
""",
    suite="repeats = 1",
    max_model_len=2048,
)

INNER = """
import os, subprocess, sys
from pathlib import Path

import psutil

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.plugin.benchmark import record_run
from pytest_qwenperf.core.http import http_get

OUT = Path({out!r})


def test_measured_with_the_key(qwenperf_run, benchmark):
    metrics = qwenperf_run.metrics
    assert (metrics["completed"], metrics["failed"]) == (24, 0), metrics
    assert qwenperf_run.token_check.matches is True, qwenperf_run.token_check.detail
    record_run(benchmark, qwenperf_run)


def test_vllm_enforces_the_key_and_bench_sends_it(vllm_server, suite_workload):
    key = ApiKey(os.environ["VLLM_API_KEY"], "VLLM_API_KEY")
    url = vllm_server.base_url
    assert http_get(url + "/v1/models")[0] == 401
    assert http_get(url + "/v1/models", api_key=key)[0] == 200
    assert [http_get(url + path)[0] for path in ("/health", "/version", "/metrics")] == [200] * 3  # open in vLLM 0.32
    root = psutil.Process(vllm_server.pid)
    assert all(key.value not in " ".join(p.cmdline()) for p in [root, *root.children(recursive=True)])
    cpus = sorted(os.sched_getaffinity(0))
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", url, "--input-len", "32", "--output-len", "16"]
    argv += ["--num-prompts", "8", "--max-concurrency", "4", "--progress", "off", "--client-cpus", str(cpus[-1])]
    done = subprocess.run(argv + ["--json", str(OUT / "bench.json"), "--detailed"], capture_output=True, text=True, timeout=300)
    (OUT / "bench.out").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr
"""


def test_a_keyed_vllm_serves_plugin_and_bench_and_the_key_is_written_nowhere(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"qpk-{secrets.token_urlsafe(24)}"
    monkeypatch.setenv("VLLM_API_KEY", key)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = pytester.path / "out"
    out.mkdir()
    suite = pytester.path / "auth.toml"
    suite.write_text(SUITE)
    pytester.makepyfile(test_keyed=INNER.format(out=str(out)))
    result = pytester.runpytest_subprocess(
        f"--qwenperf-suite={suite}",
        f"--qwenperf-json={out / 'session.json'}",
        f"--qwenperf-log-dir={out / 'logs'}",
        "--qwenperf-update-baselines",
        f"--qwenperf-baselines={out / 'baselines'}",
        f"--benchmark-json={out / 'benchmark.json'}",
        "-p",
        "no:cacheprovider",
        timeout=900,
    )
    output = result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=2)

    folders = {pytester.path, Path(os.environ["PYTEST_DEBUG_TEMPROOT"])}  # pytester made the first HOME, the second the temp root
    written = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    relative = {str(p.relative_to(out)) for p in written if p.is_relative_to(out)}
    assert {"session.json", "benchmark.json", "bench.json", "bench.out", "logs/keyed.log"} <= relative, sorted(relative)
    assert any(name.startswith("baselines/") and name.endswith(".json") for name in relative), sorted(relative)
    assert "qwenperf: baseline written" in output
    assert any(p.is_relative_to(pytester.path / ".cache" / "vllm") for p in written)  # vLLM's own cache is searched too
    assert [str(p) for p in written if key.encode() in p.read_bytes()] == []
    assert key not in output
