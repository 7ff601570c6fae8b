"""``qwenperf bench --profile`` as a user runs it: a subprocess against a real vLLM server (CPU build, tiny
model) started with vLLM's torch profiler. After the measured run, its requests go once more between
``/start_profile`` and ``/stop_profile``: the result carries the top operators by self time, the traces lie
in ``<stem>.profiles/`` beside the JSON, and the server's counters and its access log show that the measured
figures cover the measured run alone, every request of which was sent before the profiler started.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.profile import OperatorProfile
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.server import DEFAULT_BOOT_TIMEOUT_S, DEFAULT_LAUNCHER, ManagedServer
from pytest_qwenperf.suite.vllm_args import launcher_python, profiler_switch
from tests.e2e.tiny import TINY

pytestmark = pytest.mark.e2e

WARMUP, MEASURED = 4, 12


def test_bench_profile_keeps_traces_beside_its_json_and_measures_only_the_unprofiled_requests(tmp_path: Path) -> None:
    switch = profiler_switch(launcher_python(DEFAULT_LAUNCHER))
    spec = server_spec(TINY, launcher=DEFAULT_LAUNCHER, boot_timeout_s=DEFAULT_BOOT_TIMEOUT_S, profiler=switch)
    out = tmp_path / "result.json"
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--progress", "off"]
    argv += ["--client-cpus", str(max(os.sched_getaffinity(0))), "--input-len", "32", "--output-len", "16"]
    argv += ["--max-concurrency", "4", "--num-prompts", str(MEASURED), "--warmup", str(WARMUP)]
    argv += ["--profile", "--json", str(out), "--detailed"]
    with ManagedServer(spec, tmp_path / "logs") as server:
        done = subprocess.run([*argv, "--endpoint", server.base_url], capture_output=True, text=True, timeout=600, check=False)
        log = server.log_path
    assert done.returncode == 0, done.stdout + done.stderr
    assert log is not None

    result = json.loads(out.read_text())
    profile = msgspec.convert(result["profile"], OperatorProfile)
    assert profile.traces, profile
    for trace in profile.traces:  # relative to the JSON's folder, in <stem>.profiles/ beside it
        assert trace.startswith("result.profiles/") and trace.endswith((".pt.trace.json", ".pt.trace.json.gz")), trace
        assert (tmp_path / trace).is_file()
    operators = profile.cpu.operators
    assert operators and all(op.name and op.self_us > 0 and op.count > 0 and 0 < op.share <= 1 for op in operators), operators
    assert [op.self_us for op in operators] == sorted((op.self_us for op in operators), reverse=True)  # top by self time
    assert profile.cpu.total_us >= math.fsum(op.self_us for op in operators) and profile.gpu is None
    assert profile.stop_s is not None and profile.stop_s > 0

    # The figures are the measured run's: its records, and the server's counters over it (warm-up included).
    assert (result["metrics"]["completed"], result["metrics"]["failed"]) == (MEASURED, 0)
    assert len(result["requests"]) == MEASURED
    assert result["server"]["deltas"]["request_success"] == WARMUP + MEASURED
    assert result["token_check"]["matches"] is True, result["token_check"]["detail"]

    # The first-request check and the measured run before the profiler started; the same requests again while it ran.
    routes = re.findall(r'"POST (/v1/completions|/start_profile|/stop_profile) HTTP', log.read_text())
    start, stop = routes.index("/start_profile"), routes.index("/stop_profile")
    assert routes[:start] == ["/v1/completions"] * (1 + WARMUP + MEASURED)
    assert routes[start + 1 : stop] == ["/v1/completions"] * (WARMUP + MEASURED) and routes[stop + 1 :] == []
