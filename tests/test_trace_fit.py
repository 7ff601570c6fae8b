"""A trace cut to a window and fitted to a model's context (:class:`~pytest_qwenperf.suite.traces.Trace`):
send times untouched, every shared block still shared (a property, on random traces), the cacheable
share counted as a server with its own cache blocks can hit; the suite's keys, ``qwenperf trace
--read`` and ``qwenperf bench``'s trace options."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.cli import bench, bench_plan
from pytest_qwenperf.cli.main import main
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.summary import client_bound_reason
from pytest_qwenperf.loadgen.arrivals import Replay
from pytest_qwenperf.measure.observe import _lag_limit_s
from pytest_qwenperf.serving.server import ServerInfo
from pytest_qwenperf.suite.trace_files import read_trace
from pytest_qwenperf.suite.traces import BLOCK_TOKENS, Trace, TraceEntry, TraceError, TraceShape, prompt_ids
from pytest_qwenperf.suite.workloads import ALGORITHM_VERSION, TraceWorkload
from tests.suite_files import HEADER, refused, suite_at

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "tests" / "data" / "traces" / "mooncake-conversation-180s.jsonl"


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Requests in time order whose prompts open with a chain of blocks shared with earlier ones
    (as Mooncake's chained hash ids do), then blocks of their own, the last block often partial."""
    entries: list[TraceEntry] = []
    next_id, at = 0, 0.0
    for _ in range(draw(st.integers(1, 12))):
        at += draw(st.sampled_from([0.0, 0.0, 1.0, 250.0, 3_000.0]))  # bursts: many in one millisecond
        earlier = draw(st.sampled_from(entries)) if entries and draw(st.booleans()) else None
        shared = earlier.hash_ids[: draw(st.integers(1, len(earlier.hash_ids)))] if earlier else ()
        own = draw(st.integers(0 if shared else 1, 6))
        ids = (*shared, *range(next_id, next_id + own))
        next_id += own
        length = draw(st.integers((len(ids) - 1) * BLOCK_TOKENS + 1, len(ids) * BLOCK_TOKENS))
        entries.append(TraceEntry(at, length, draw(st.integers(1, 2_000)), ids))
    return Trace(tuple(entries))


def block_of(size: int) -> Callable[[int], list[int]]:
    return lambda hash_id: [hash_id * 100_000 + i for i in range(size)]


def tail(index: int, n: int) -> list[int]:
    return [-(index * 100_000 + i) - 1 for i in range(n)]


def shared_positions(trace: Trace) -> list[tuple[int, int, int]]:
    """(request, earlier request, block position) wherever two requests name the same hash id at the same position."""
    return [
        (i, j, k)
        for i, entry in enumerate(trace.entries)
        for j, other in enumerate(trace.entries[:i])
        for k, (a, b) in enumerate(zip(entry.hash_ids, other.hash_ids, strict=False))
        if a == b
    ]


@given(traces())
def test_fitting_to_half_the_context_keeps_the_times_and_every_shared_block_shared(trace: Trace) -> None:
    context = max(2, trace.longest() // 2)
    fitted = trace.fitted(context, "scale")
    assert fitted.longest() <= context
    assert [e.timestamp_ms for e in fitted.entries] == [e.timestamp_ms for e in trace.entries]
    assert BLOCK_TOKENS % fitted.block_tokens == 0
    assert (fitted.block_tokens < BLOCK_TOKENS) == (trace.longest() > context)  # scaled exactly where it had to be
    block = block_of(fitted.block_tokens)
    prompts = [prompt_ids(e, i, block, tail) for i, e in enumerate(fitted.entries)]
    assert [len(p) for p in prompts] == [e.input_length for e in fitted.entries]
    for entry in fitted.entries:  # each prompt still reaches into every block it named
        assert math.ceil(entry.input_length / fitted.block_tokens) == len(entry.hash_ids)
    for i, j, k in shared_positions(trace):  # every block two requests shared, they share in full where both reach
        start = k * fitted.block_tokens
        end = min(start + fitted.block_tokens, len(prompts[i]), len(prompts[j]))
        assert end > start and prompts[i][start:end] == prompts[j][start:end]


@given(traces())
def test_capping_keeps_the_times_and_the_blocks_before_the_cut(trace: Trace) -> None:
    context = max(2, trace.longest() // 2)
    capped = trace.fitted(context, "cap")
    assert capped.longest() <= context and capped.block_tokens == BLOCK_TOKENS
    for before, after in zip(trace.entries, capped.entries, strict=True):
        assert after.timestamp_ms == before.timestamp_ms
        assert after.output_length == min(before.output_length, context // 2)
        assert after.input_length == min(before.input_length, context - after.output_length)
        assert after.hash_ids == before.hash_ids[: math.ceil(after.input_length / BLOCK_TOKENS)]
    assert str(sum(a != b for a, b in zip(trace.entries, capped.entries, strict=True))) == capped.fit.split()[0]


def test_a_trace_that_fits_is_left_as_traced_and_one_that_cannot_is_named() -> None:
    trace = Trace((TraceEntry(0, 600, 10, (1, 2)), TraceEntry(5, 100, 4, (1,))))
    same = trace.fitted(4_096, "scale")
    assert same.entries == trace.entries and same.fit == "as traced (it fits), to fit 4,096 tokens"
    with pytest.raises(TraceError, match=r"fit_context: 2 tokens cannot hold the longest request even at 1/512"):
        trace.fitted(2, "scale")


def test_the_cacheable_share_counts_whole_cache_blocks_short_of_the_last_token() -> None:
    trace = Trace((TraceEntry(0, 600, 1, (1, 2)), TraceEntry(1, 700, 1, (1, 2)), TraceEntry(2, 300, 1, (1,))))
    # every shared token: all 700 of the second (both its blocks were seen), all 300 of the third
    assert trace.cacheable_share() == pytest.approx((700 + 300) / 1_600)
    # whole 128-token blocks short of the last token: 640 of the second (699 -> 640), 256 of the third (299 -> 256)
    assert trace.cacheable_share(128) == pytest.approx((640 + 256) / 1_600)
    scaled = trace.fitted(100, "scale")  # 1/8: 88 + 1 tokens the longest, blocks of 64 tokens
    assert scaled.block_tokens == 64 and scaled.longest() == 89
    assert scaled.cacheable_share() > 0.5 and scaled.cacheable_share(128) == 0.0  # no request shares 128 tokens any more


def test_a_window_is_cut_by_time_from_the_first_request() -> None:
    trace = Trace(tuple(TraceEntry(1_000.0 * t, 10, 1) for t in (2, 3, 3, 7, 9)))
    assert [e.timestamp_ms for e in trace.window(1.0, 5.0).entries] == [3_000.0, 3_000.0, 7_000.0]  # 1 s to 6 s after the first
    assert len(trace.window(5.0).entries) == 2
    with pytest.raises(TraceError, match=r"^no request was sent from 8 s to 10 s \(the trace spans 7 s\)$"):
        trace.window(8.0, 2.0)


def test_the_shape_of_the_real_trace_shows_its_bursts_and_lengths() -> None:
    shape = TraceShape.of(read_trace(MOONCAKE))
    assert (shape.requests, shape.span_s) == (556, 179.999)
    assert shape.bursts.max == 16 and shape.input_lengths.max == 121_298 and shape.output_lengths.max == 2_000
    assert len(shape.rates) == 12 and sum(rate * shape.bin_s for rate in shape.rates) == pytest.approx(556)


def workload_suite(keys: str) -> str:
    return HEADER + f'\n[[workload]]\nname = "real"\nkind = "trace"\npath = "{MOONCAKE}"\n{keys}\nload = {{ replay = true }}\n'


def test_a_suite_replays_a_window_of_a_real_trace_fitted(tmp_path: Path) -> None:
    suite = suite_at(tmp_path, workload_suite('start_s = 120\nspan_s = 12\nfit = "scale"\nfit_context = 2048'))
    workload = suite.workloads[0].workload
    assert isinstance(workload, TraceWorkload) and workload.id == "real"
    fitted = workload.trace()
    assert fitted.fit == "lengths scaled by 1/64, blocks of 8 tokens, to fit 2,048 tokens" and fitted.longest() <= 2048
    assert len(fitted.entries) == len(workload.traced().entries) == len(read_trace(MOONCAKE).window(120, 12).entries)
    unnamed = TraceWorkload(str(MOONCAKE), start_s=120, span_s=12, fit="scale", fit_context=2048)
    assert unnamed.id == "trace-mooncake-conversation-180s-from120s-for12s-scale2048"


def test_a_whole_trace_keeps_the_fingerprint_it_had_before_windows_and_fits(tmp_path: Path) -> None:
    content = hashlib.sha256(MOONCAKE.read_bytes()).hexdigest()
    payload = {"kind": "trace", "algorithm": ALGORITHM_VERSION, "path": content, "num_prompts": None, "seed": 0}
    before = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert TraceWorkload(str(MOONCAKE)).fingerprint() == before
    assert TraceWorkload(str(MOONCAKE), span_s=10).fingerprint() != before


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ('fit = "scale"', r"workload 'real': fit_context: expected a context in tokens with fit, and only with fit, got None$"),
        ('fit = "shrink"\nfit_context = 512', r"workload 'real': fit: expected one of scale, cap, got 'shrink'$"),
        ("span_s = 0", r"workload 'real': span_s: expected a finite number of seconds > 0, got 0.0$"),
        ("start_s = 500", r"start_s, span_s: no request was sent from 500 s to the end \(the trace spans 179.999 s\)"),
    ],
)
def test_a_bad_window_or_fit_names_the_key(tmp_path: Path, keys: str, message: str) -> None:
    if keys.startswith("start_s = 500"):  # the trace is read when the workload builds, not when the suite loads
        workload = suite_at(tmp_path, workload_suite(keys)).workloads[0].workload
        assert isinstance(workload, TraceWorkload)
        with pytest.raises(ValueError, match=message):
            workload.trace()
        return
    refused(tmp_path, workload_suite(keys), message)


def test_the_trace_command_reports_a_windows_shape_fitted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["trace", "--read", str(MOONCAKE), "--start", "120", "--span", "30", "--fit", "scale", "--context", "2048", "--kv-block", "128"]
    assert main([*args, str(tmp_path / "window.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"{MOONCAKE}, from 120 s to 150 s:" in out
    assert "fitted (lengths scaled by 1/64, blocks of 8 tokens, to fit 2,048 tokens):" in out
    assert "requests sent in the same millisecond: p50 11, p90 14, p99 14, max 14" in out
    assert "in whole 128-token blocks)" in out
    window = read_trace(tmp_path / "window.jsonl")  # the window as traced, its times as in the trace
    assert window == read_trace(MOONCAKE).window(120, 30)
    assert main(["trace", "--read", str(MOONCAKE), "--fit", "cap"]) == 2
    assert "--fit and --context go together" in capsys.readouterr().err
    assert main(["trace"]) == 2


def bench_args(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--endpoint", "http://127.0.0.1:9", *args])


def server(max_model_len: int | None) -> ServerInfo:
    return ServerInfo(base_url="http://127.0.0.1:9", model="m", version=None, max_model_len=max_model_len)


def test_bench_replays_a_trace_window_fitted_to_the_servers_context() -> None:
    args = bench_args("--dataset-name", "trace", "--dataset-path", str(MOONCAKE), "--trace-start", "120", "--trace-span", "12",
                      "--trace-fit", "scale", "--time-scale", "0.5", "--warmup", "2")  # fmt: skip
    workload = bench_plan.workload(args, [server(2048)])
    assert isinstance(workload, TraceWorkload)
    assert (workload.start_s, workload.span_s, workload.fit, workload.fit_context, workload.num_prompts) == (120.0, 12.0, "scale", 2048, None)
    assert bench_plan.arrival(args, 10) == Replay(time_scale=0.5)
    given_context = bench_plan.workload(bench_args(*vars_of(args), "--trace-context", "1024"), [server(None)])
    assert isinstance(given_context, TraceWorkload) and given_context.fit_context == 1024


def vars_of(args: argparse.Namespace) -> list[str]:
    return ["--dataset-name", "trace", "--dataset-path", str(args.dataset_path), "--trace-fit", args.trace_fit]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--dataset-name", "trace"), "--dataset-name trace needs --dataset-path FILE"),
        (("--time-scale", "0.5"), "--time-scale: only a trace has them (--dataset-name trace)"),
        (("--dataset-name", "trace", "--dataset-path", str(MOONCAKE), "--trace-context", "512"), "--trace-context is the context --trace-fit fits to"),
        (("--dataset-name", "trace", "--dataset-path", str(MOONCAKE), "--trace-fit", "cap"), "the server does not say its max_model_len"),
    ],
)
def test_bench_names_what_a_trace_replay_lacks(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(bench_plan.BenchError, match=re.escape(message)):
        bench_plan.workload(bench_args(*args), [server(None)])


def test_bench_time_scale_goes_with_a_replay_not_a_loop() -> None:
    args = bench_args("--dataset-name", "trace", "--dataset-path", str(MOONCAKE), "--time-scale", "2", "--max-concurrency", "4")
    with pytest.raises(bench_plan.BenchError, match="--time-scale and --max-lag replay a trace at its times"):
        bench_plan.arrival(args, 10)
    strict = bench_args("--dataset-name", "trace", "--dataset-path", str(MOONCAKE), "--max-lag", "2")
    assert bench_plan.arrival(strict, 10) == Replay(time_scale=1.0, max_lag_ms=2.0)


def test_bench_builds_conversations_of_the_given_turns() -> None:
    args = bench_args("--dataset-name", "conversation", "--num-prompts", "10", "--turns", "3", "--input-len", "32",
                      "--turn-input-len", "8", "--output-len", "4", "--think-time", "0.5")  # fmt: skip
    workload = bench_plan.workload(args, [])
    assert (workload.conversations, workload.turns, workload.first_input_len, workload.turn_input_len) == (4, 3, 32, 8)  # type: ignore[attr-defined]
    assert workload.think_time_s == 0.5  # type: ignore[attr-defined]


def test_a_replay_states_the_lag_it_allows_and_a_late_one_is_client_bound() -> None:
    assert _lag_limit_s(Replay(max_lag_ms=2.0)) == 0.002 and _lag_limit_s(Replay()) == 0.05
    late = [RequestRecord(index=i, endpoint="e", scheduled_at=0.0, sent_at=0.003, ended_at=1.0, status=200) for i in range(10)]  # 3 ms late each
    assert client_bound_reason(late, lag_p99_limit_s=_lag_limit_s(Replay(max_lag_ms=2.0))) == "p99 scheduling lag 3.0 ms exceeds 2.0 ms"
    assert client_bound_reason(late, lag_p99_limit_s=_lag_limit_s(Replay())) is None


def test_a_suite_replay_states_its_lag_and_a_bad_one_is_named(tmp_path: Path) -> None:
    suite = suite_at(tmp_path, workload_suite("").replace("load = { replay = true }", "load = { replay = true, max_lag_ms = 2 }"))
    assert suite.workloads[0].arrival == Replay(max_lag_ms=2)
    bad = workload_suite("").replace("load = { replay = true }", "load = { replay = true, max_lag_ms = 0 }")
    refused(tmp_path, bad, r"workload 'real'.load.max_lag_ms: expected a finite number of milliseconds > 0")
