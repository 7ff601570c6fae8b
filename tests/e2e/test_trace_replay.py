"""A real public trace (a slice of Mooncake's conversation trace, tests/data/traces/README.md)
replayed on the CPU build, fitted to the tiny model's context: from ``qwenperf bench`` against
the session's server, and from a suite through the perf suite's own trace test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_qwenperf.serving.server import ManagedServer
from pytest_qwenperf.suite.traces import Trace, read_trace
from tests.e2e.test_bench_cli import bench
from tests.e2e.tiny import TINY, inner_session, suite_toml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "tests" / "data" / "traces" / "mooncake-conversation-180s.jsonl"


@pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])
def test_bench_replays_a_window_of_a_real_trace_fitted_to_the_servers_context(vllm_server: ManagedServer, tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    done = bench(
        vllm_server, "--dataset-name", "trace", "--dataset-path", str(MOONCAKE), "--trace-start", "120", "--trace-span", "12",
        "--trace-fit", "scale", "--time-scale", "0.5", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    window = Trace(read_trace(MOONCAKE)).window(120.0, 12.0)
    fitted = window.fitted(2048, "scale")  # the server's max_model_len, which the bench asked it for
    result = json.loads(out.read_text())
    assert result["metrics"]["completed"] == len(fitted.entries) and result["metrics"]["failed"] == 0
    assert result["token_check"]["matches"] is True, result["token_check"]  # the server's own counts agree
    assert result["metrics"]["total_input_tokens"] == sum(e.input_length for e in fitted.entries)
    assert result["metrics"]["total_output_tokens"] == sum(e.output_length for e in fitted.entries)
    trace = result["trace"]
    assert trace["time_scale"] == 0.5 and trace["fit"] == fitted.fit and trace["kv_block"] == 128  # the CPU build's block
    assert trace["cacheable_share"] == pytest.approx(fitted.cacheable_share(128))
    assert trace["traced_cacheable_share"] == pytest.approx(window.cacheable_share(128))
    line = next(line for line in done.stdout.splitlines() if line.startswith("Trace replay"))
    assert "sent at the traced times x0.5, late by p50" in line and "as fitted (lengths scaled by 1/64" in line


SUITE = suite_toml(
    "mooncake",
    f"""
[[config]]
id = "cached"
vllm = {{ enable-prefix-caching = true }}

[[workload]]
name = "mooncake-conversation"
kind = "trace"
path = "{MOONCAKE}"
start_s = 120
span_s = 15
fit = "scale"
fit_context = 2048
warmup = 8
load = {{ replay = true }}
""",
    suite="repeats = 1",
    max_model_len=2048,
)


def test_a_suite_replays_the_real_trace_as_recorded_fitted(pytester: pytest.Pytester) -> None:
    (pytester.path / "suite.toml").write_text(SUITE)
    pytester.makepyfile(test_trace=(ROOT / "perf_tests" / "test_trace.py").read_text())
    result = inner_session(pytester, "test_trace.py", "mooncake", "-rs")
    result.assert_outcomes(passed=1)  # tokens exact, no lag flagged, the hit rate within what the fitted blocks allow
    run = json.loads((pytester.path / "mooncake.json").read_text())["runs"][0]
    assert run["trace"]["fit"].startswith("lengths scaled by 1/64, blocks of 8 tokens")
    assert run["trace"]["kv_block"] == 128
