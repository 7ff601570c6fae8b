"""A real public trace (a slice of Mooncake's conversation trace, tests/data/traces/README.md)
replayed on the CPU build, fitted to the tiny model's context: from ``qwenperf bench`` against
the session's server, and from a suite through the perf suite's own trace test."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from pytest_qwenperf.serving.server import ManagedServer
from pytest_qwenperf.suite.trace_files import read_trace
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
    window = read_trace(MOONCAKE).window(120.0, 12.0)
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


def bailian_conversations(path: Path) -> list[dict[str, object]]:
    """Six conversations of three turns in Bailian's format, written here (the published Bailian
    files are stored as Git LFS objects, not to be had offline): each turn's prompt holds the one
    before it (its 16-token blocks) and more, traced 20 ms apart (sooner than the tiny model answers
    24 tokens: sent at their traced times, turns would overlap), the conversations 0.1 s apart.
    Every prompt's length differs, which names its request in the results."""
    rows = []
    for c in range(6):
        ids: list[int] = []
        for turn in range(3):
            ids += [c * 1_000 + turn * 100 + b for b in range(20)]
            rows.append({
                "chat_id": c * 10 + turn, "parent_chat_id": c * 10 + turn - 1 if turn else -1, "turn": turn + 1,
                "timestamp": round(c * 0.1 + turn * 0.02, 3), "input_length": len(ids) * 16 - c - 1, "output_length": 24,
                "type": "text", "hash_ids": list(ids),
            })  # fmt: skip
    rows.sort(key=lambda row: row["timestamp"])  # type: ignore[arg-type, return-value]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


@pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])
def test_bench_replays_a_bailian_trace_each_turn_after_the_answer_before_it(vllm_server: ManagedServer, tmp_path: Path) -> None:
    rows = bailian_conversations(tmp_path / "bailian.jsonl")
    out = tmp_path / "replay.json"
    done = bench(vllm_server, "--dataset-name", "trace", "--dataset-path", str(tmp_path / "bailian.jsonl"), "--json", str(out), "--detailed")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["metrics"]["completed"] == len(rows) and result["metrics"]["failed"] == 0
    assert result["token_check"]["matches"] is True, result["token_check"]  # the server's own counts agree
    assert result["metrics"]["total_input_tokens"] == sum(int(row["input_length"]) for row in rows)  # type: ignore[call-overload]
    by_length = {r["input_tokens"]: r for r in result["requests"]}
    for c in range(6):
        turns = [by_length[(20 * (turn + 1)) * 16 - c - 1] for turn in range(3)]
        for before, after in itertools.pairwise(turns):
            assert after["start"] >= before["end"], (c, turns)  # a turn goes once the answer before it has come
    assert result["trace"]["kv_block"] == 128 and result["trace"]["cacheable_share"] > 0.3
