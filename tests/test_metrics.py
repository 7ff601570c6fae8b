"""Tests for pytest_qwenperf.core.summary: hand-computed runs, a vLLM reference re-computation, invariants."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.core.metrics import UnknownMetric, metric
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.summary import (
    GoodputSLO,
    Metric,
    client_bound_reason,
    cross_check,
    inter_token_latencies,
    prompt_lengths_off,
    steady_window,
    summarize,
)


def rec(
    index: int,
    sent: float,
    chunks: list[tuple[float, int]] = (),
    *,
    ended: float | None = None,
    prompt: int = 10,
    completion: int | None = None,
    lag: float = 0.0,
    status: int | None = 200,
    error: str | None = None,
    expected: int | None = None,
    warmup: bool = False,
) -> RequestRecord:
    """A record; completion defaults to the streamed tokens, ended to the last chunk."""
    times = tuple(t for t, _ in chunks)
    tokens = tuple(k for _, k in chunks)
    return RequestRecord(
        index=index,
        endpoint="/v1/completions",
        scheduled_at=sent - lag,
        sent_at=sent,
        ended_at=ended if ended is not None else (times[-1] if times else sent),
        chunk_times=times,
        chunk_tokens=tokens,
        prompt_tokens=prompt,
        completion_tokens=sum(tokens) if completion is None else completion,
        expected_output_tokens=expected,
        status=status,
        error=error,
        warmup=warmup,
    )


def scaled(record: RequestRecord, k: float) -> RequestRecord:
    return dataclasses.replace(
        record,
        scheduled_at=record.scheduled_at * k,
        sent_at=record.sent_at * k,
        ended_at=record.ended_at * k,
        chunk_times=tuple(t * k for t in record.chunk_times),
    )


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


# --- strategies ----------------------------------------------------------------------


@st.composite
def a_record(draw, index: int, *, one_token_chunks: bool = False, kinds=("ok", "ok", "failed", "truncated", "warmup")):
    kind = draw(st.sampled_from(kinds))
    sent = draw(st.floats(0, 100))
    n_chunks = draw(st.integers(1 if kind in ("ok", "warmup") else 0, 6))
    gaps = draw(st.lists(st.floats(1e-3, 5), min_size=n_chunks, max_size=n_chunks))
    times = list(itertools.accumulate(gaps, initial=sent))[1:]
    tokens = draw(st.lists(st.integers(1, 1 if one_token_chunks else 4), min_size=n_chunks, max_size=n_chunks))
    ended = (times[-1] if times else sent) + draw(st.floats(1e-3, 1))  # usage chunk, [DONE] or the error
    common = {"ended": ended, "prompt": draw(st.integers(1, 2000)), "lag": draw(st.floats(0, 0.5)), "warmup": kind == "warmup"}
    chunks = list(zip(times, tokens, strict=True))
    if kind == "failed":
        return rec(index, sent, chunks, status=draw(st.sampled_from([200, 500, None])), error="boom", **common)
    if kind == "truncated":
        return rec(index, sent, chunks, expected=sum(tokens) + 1, **common)
    return rec(index, sent, chunks, **common)


@st.composite
def a_run(draw, *, min_size: int = 1, max_size: int = 10, **kwargs) -> list[RequestRecord]:
    n = draw(st.integers(min_size, max_size))
    return [draw(a_record(i, **kwargs)) for i in range(n)]


# --- a hand-computed run -------------------------------------------------------------

# r0: 3 one-token chunks; r1: a 1-token then a 2-token chunk; r2 failed; r3 one token.
HAND_RUN = [
    rec(0, 0.0, [(0.5, 1), (1.0, 1), (2.5, 1)], ended=2.75, prompt=10, lag=0.0),
    rec(1, 1.0, [(1.25, 1), (2.25, 2)], ended=2.5, prompt=20, lag=0.01),
    rec(2, 2.0, ended=2.5, prompt=0, completion=0, status=500, error="boom", lag=0.02),
    rec(3, 3.0, [(3.5, 1)], ended=4.0, prompt=5, lag=0.1),
    rec(100, -5.0, [(-4.5, 7)], ended=-4.0, prompt=999, warmup=True),  # never counted
]


def pstd(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def test_hand_computed_run_has_every_vllm_key_with_known_values():
    values = summarize(HAND_RUN).values()
    ttfts, tpots, itls, e2els = [0.5, 0.25, 0.5], [1.0, 0.5], [0.5, 1.5, 0.5, 0.5], [2.5, 1.25, 0.5]
    expected = {
        "duration": 4.0,  # first sent 0.0 .. last ended 4.0
        "completed": 3,
        "failed": 1,
        "total_input_tokens": 35,
        "total_output_tokens": 7,
        "request_throughput": 0.75,
        "output_throughput": 1.75,
        "total_token_throughput": 10.5,
        "mean_ttft_ms": 1000 * 1.25 / 3,
        "median_ttft_ms": 500.0,
        "std_ttft_ms": 1000 * pstd(ttfts),
        "p50_ttft_ms": 500.0,
        "p90_ttft_ms": 500.0,
        "p99_ttft_ms": 500.0,
        "mean_tpot_ms": 750.0,
        "median_tpot_ms": 750.0,
        "std_tpot_ms": 250.0,
        "p50_tpot_ms": 750.0,
        "p90_tpot_ms": 950.0,  # 0.5 + 0.9 * (1.0 - 0.5)
        "p99_tpot_ms": 995.0,
        "mean_itl_ms": 750.0,
        "median_itl_ms": 500.0,
        "std_itl_ms": 1000 * pstd(itls),
        "p50_itl_ms": 500.0,
        "p90_itl_ms": 1200.0,  # sorted [.5, .5, .5, 1.5], position 2.7
        "p99_itl_ms": 1470.0,
        "mean_e2el_ms": 1000 * 4.25 / 3,
        "median_e2el_ms": 1250.0,
        "std_e2el_ms": 1000 * pstd(e2els),
        "p50_e2el_ms": 1250.0,
        "p90_e2el_ms": 2250.0,  # sorted [.5, 1.25, 2.5], position 1.8
        "p99_e2el_ms": 2475.0,
        # buckets from t=0: [1, 2, 3, 1] tokens (vLLM's per-chunk count would peak at 2)
        "max_output_tokens_per_s": 3.0,
        "max_concurrent_requests": 2,  # r0 in seconds 0-2, r1 in 1-2, r3 in 3
        "achieved_request_rate": 1.0,  # 3 gaps over 3 s
        "p50_scheduling_lag_ms": 15.0,
        "p99_scheduling_lag_ms": 97.6,  # sorted [0, .01, .02, .1], position 2.97
        "max_scheduling_lag_ms": 100.0,
    }
    assert values.keys() == expected.keys()
    for name, value in expected.items():
        assert values[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
    assert ttfts and tpots  # the lists above are the per-request values the formulas were applied to


def test_metrics_carry_unit_and_direction_and_are_immutable():
    summary = summarize(HAND_RUN, requested_rate=1.0, goodput_slo=GoodputSLO(ttft_ms=400))
    assert summary["output_throughput"] == Metric("output_throughput", 1.75, "tok/s", "higher")
    assert summary["p99_ttft_ms"].unit == "ms" and summary["p99_ttft_ms"].direction == "lower"
    assert summary["failed"].direction == "lower"
    assert summary["requested_request_rate"].value == 1.0
    assert summary["request_goodput"].unit == "req/s"
    for name, value in summary.metrics.items():
        assert (value.unit, value.direction) == (metric(name).unit, metric(name).direction)
    with pytest.raises(TypeError):
        summary.metrics["failed"] = Metric("failed", 0, "count", "lower")  # type: ignore[index]
    with pytest.raises(KeyError, match="unknown metric 'bogus_metric'; known: total_token_throughput, "):
        Metric.of("bogus_metric", 1.0)


def test_the_registry_answers_for_family_members_and_names_what_it_knows():
    assert (metric("p99.9_scheduling_lag_ms").unit, metric("p99.9_scheduling_lag_ms").tolerance) == ("ms", None)
    assert metric("p99_ttft_ms").tolerance == 0.25  # a family member with an entry of its own
    scaling = metric("scaling_efficiency_n12")
    assert (scaling.direction, scaling.tolerance, scaling.floor) == ("higher", 0.03, True)
    assert metric("tokens_per_joule").path == ("telemetry", "gpu", "tokens_per_joule")
    with pytest.raises(UnknownMetric) as raised:
        metric("p99_ttft_s")
    assert str(raised.value).endswith("scaling_efficiency_n<N>") and "gpu_utilization" in str(raised.value)


def test_no_completed_requests_gives_vllm_zero_fill():
    values = summarize([rec(0, 0.0, ended=1.0, completion=0, status=None, error="refused")]).values()
    assert values["completed"] == 0 and values["failed"] == 1
    for name in ("mean_ttft_ms", "median_tpot_ms", "std_itl_ms", "p99_e2el_ms", "output_throughput"):
        assert values[name] == 0.0
    assert values["max_concurrent_requests"] == 0
    assert summarize([]).values()["duration"] == 0.0


def test_explicit_duration_and_percentile_key_spelling():
    values = summarize(HAND_RUN, duration_s=7.0, percentiles=(25, 99.9)).values()
    assert values["request_throughput"] == 3 / 7.0
    assert "p25_ttft_ms" in values and "p99.9_e2el_ms" in values and "p50_ttft_ms" not in values
    assert "median_ttft_ms" in values
    with pytest.raises(ValueError, match="duration_s must be positive"):
        summarize(HAND_RUN, duration_s=0.0)


# --- reference: vLLM's calculate_metrics, re-written simply --------------------------


def vllm_reference(records: list[RequestRecord], dur_s: float, percentiles) -> dict[str, float]:
    """calculate_metrics from vllm/benchmarks/serve.py over outputs built like endpoint_request_func.

    ``success`` is our ``ok`` (a deliberate difference); token times for the peak bucket
    are the chunk times, which vLLM rebuilds as start + ttft + cumulative itl.
    """
    outputs = []
    for r in records:
        if r.warmup:
            continue
        st_ = r.sent_at
        out = {"success": r.ok, "start_time": st_, "prompt_len": r.prompt_tokens, "output_tokens": r.completion_tokens}
        if r.ok:
            most_recent = st_
            itl = []
            for i, t in enumerate(r.chunk_times):
                if i == 0:
                    out["ttft"] = t - st_
                else:
                    itl.append(t - most_recent)
                most_recent = t
            out |= {"itl": itl, "latency": most_recent - st_, "token_times": list(r.chunk_times)}
        outputs.append(out)

    total_input = completed = 0
    output_lens, itls, tpots, ttfts, e2els = [], [], [], [], []
    for o in outputs:
        if o["success"]:
            output_len = o["output_tokens"]
            output_lens.append(output_len)
            total_input += o["prompt_len"]
            if output_len > 1:
                tpots.append((o["latency"] - o["ttft"]) / (output_len - 1))
            itls += o["itl"]
            ttfts.append(o["ttft"])
            e2els.append(o["latency"])
            completed += 1
    ref = {
        "completed": completed,
        "failed": sum(not o["success"] for o in outputs),
        "total_input_tokens": total_input,
        "total_output_tokens": sum(output_lens),
        "request_throughput": completed / dur_s,
        "output_throughput": sum(output_lens) / dur_s,
        "total_token_throughput": (total_input + sum(output_lens)) / dur_s,
    }
    for name, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        ref[f"mean_{name}_ms"] = np.mean(xs or 0) * 1000
        ref[f"median_{name}_ms"] = np.median(xs or 0) * 1000
        ref[f"std_{name}_ms"] = np.std(xs or 0) * 1000
        for p in percentiles:
            ref[f"p{p}_{name}_ms"] = np.percentile(xs or 0, p) * 1000

    ok = [o for o in outputs if o["success"]]
    ref["max_output_tokens_per_s"], ref["max_concurrent_requests"] = 0.0, 0
    if ok:
        t0 = min(o["start_time"] for o in ok)
        n = int(np.ceil(max(o["start_time"] + o["latency"] for o in ok) - t0)) + 1
        tokens, concurrent = [0] * n, [0] * n
        for o in ok:
            for t in o["token_times"]:
                if 0 <= int(t - t0) < n:
                    tokens[int(t - t0)] += 1
            for second in range(int(o["start_time"] - t0), int(o["start_time"] + o["latency"] - t0) + 1):
                concurrent[second] += 1
        ref["max_output_tokens_per_s"], ref["max_concurrent_requests"] = float(max(tokens)), max(concurrent)
    return ref


def run_duration(records: list[RequestRecord]) -> float:
    run = [r for r in records if not r.warmup]
    return max(r.ended_at for r in run) - min(r.sent_at for r in run)


@given(a_run())
def test_matches_vllm_reference_for_ttft_tpot_e2el_and_throughput(records):
    if all(r.warmup for r in records):
        return
    dur = run_duration(records)
    ours = summarize(records).values()
    ref = vllm_reference(records, dur, (50, 90, 99))
    assert ours["duration"] == pytest.approx(dur, rel=1e-12)
    for name, value in ref.items():
        if "itl" in name or name == "max_output_tokens_per_s":
            continue  # per token here, per chunk in vLLM: compared below with one-token chunks
        assert close(ours[name], value), (name, ours[name], value)


@given(a_run(one_token_chunks=True))
def test_with_one_token_chunks_itl_and_peak_equal_vllm_per_chunk_values(records):
    if all(r.warmup for r in records):
        return
    ours = summarize(records).values()
    ref = vllm_reference(records, run_duration(records), (50, 90, 99))
    for name in [n for n in ref if "itl" in n] + ["max_output_tokens_per_s"]:
        assert close(ours[name], ref[name]), (name, ours[name], ref[name])


@given(a_run(kinds=("ok",)), st.lists(st.floats(0, 100), min_size=1, max_size=6))
def test_percentiles_equal_numpy_and_are_monotone(records, percentiles):
    percentiles = sorted(percentiles)
    values = summarize(records, percentiles=percentiles).values()
    ttfts = [(r.chunk_times[0] - r.sent_at) for r in records]
    keys = [f"p{int(p) if int(p) == p else p}_ttft_ms" for p in percentiles]
    for p, key in zip(percentiles, keys, strict=True):
        assert values[key] == np.percentile(ttfts, p) * 1000
    for lower, higher in itertools.pairwise(keys):
        assert values[lower] <= values[higher] + 1e-9
    assert values["median_ttft_ms"] == np.median(ttfts) * 1000


# --- invariants ----------------------------------------------------------------------


@given(a_run(), st.floats(0.1, 10))
def test_scaling_time_scales_throughput_inversely_and_latency_linearly(records, k):
    if all(r.warmup for r in records):
        return
    before = summarize(records).values()
    after = summarize([scaled(r, k) for r in records]).values()
    for name in ("request_throughput", "output_throughput", "total_token_throughput"):
        assert after[name] == pytest.approx(before[name] / k, rel=1e-6, abs=1e-9), name
    for name, value in before.items():
        if name.endswith("_ms"):
            assert after[name] == pytest.approx(value * k, rel=1e-6, abs=1e-6), name
    assert after["duration"] == pytest.approx(before["duration"] * k, rel=1e-9)


@given(a_run(), a_record(10_000, kinds=("failed", "truncated")))
def test_a_failed_request_never_adds_output(records, failure):
    before = summarize(records).values()
    after = summarize([*records, failure]).values()
    assert after["total_output_tokens"] == before["total_output_tokens"]
    assert after["output_throughput"] <= before["output_throughput"] or before["completed"] == 0
    assert after["failed"] == before["failed"] + 1


@given(a_run())
def test_output_throughput_times_duration_is_total_output(records):
    values = summarize(records).values()
    assert values["output_throughput"] * values["duration"] == pytest.approx(values["total_output_tokens"], rel=1e-9)
    assert values["request_throughput"] * values["duration"] == pytest.approx(values["completed"], rel=1e-9)


# --- per-token ITL -------------------------------------------------------------------


@given(st.floats(1e-3, 10), st.integers(1, 8))
def test_a_k_token_chunk_gives_k_equal_gaps_summing_to_the_chunk_gap(gap, k):
    record = rec(0, 0.0, [(0.25, 1), (0.25 + gap, k)])
    gaps = inter_token_latencies(record)
    assert len(gaps) == k
    assert gaps == [((0.25 + gap) - 0.25) / k] * k
    assert sum(gaps) == pytest.approx((0.25 + gap) - 0.25, rel=1e-12)
    assert summarize([record]).values()["mean_itl_ms"] == pytest.approx(1000 * gap / k, rel=1e-9)


@given(a_run(kinds=("ok",)))
def test_itl_entries_are_completion_minus_one_and_average_to_tpot(records):
    for r in records:
        gaps = inter_token_latencies(r)
        assert len(gaps) == r.completion_tokens - 1
        assert sum(gaps) == pytest.approx(r.chunk_times[-1] - r.chunk_times[0], rel=1e-9, abs=1e-12)
    total_gaps = sum(r.completion_tokens - 1 for r in records)
    values = summarize(records, percentiles=()).values()
    if total_gaps:
        expected = np.mean([g for r in records for g in inter_token_latencies(r)]) * 1000
        assert values["mean_itl_ms"] == pytest.approx(expected, rel=1e-12)


def test_first_chunk_extra_tokens_arrive_with_zero_gap():
    assert inter_token_latencies(rec(0, 0.0, [(1.0, 3), (2.0, 2)])) == [0.0, 0.0, 0.5, 0.5]


def test_zero_token_chunk_is_rejected():
    with pytest.raises(ValueError, match="0 tokens"):
        inter_token_latencies(rec(0, 0.0, [(1.0, 1), (2.0, 0)], completion=1))


# --- goodput -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "goodput"),
    [
        ("ttft:400", 0.25),  # only r1 (ttft 0.25 s)
        ("ttft:500", 0.75),  # boundary counts: slo >= value
        ("tpot:600", 0.5),  # r1 (0.5 s) and r3 (one token: tpot 0)
        ("ttft:500 e2el:1000", 0.25),  # only r3
        ("ttft:1 tpot:1 e2el:1", 0.0),
    ],
)
def test_goodput_counts_requests_meeting_every_slo(spec, goodput):
    assert summarize(HAND_RUN, goodput_slo=GoodputSLO.parse(spec))["request_goodput"].value == goodput


def test_goodput_absent_without_slo():
    assert "request_goodput" not in summarize(HAND_RUN).values()


def test_goodput_parse_accepts_vllm_syntax():
    assert GoodputSLO.parse("ttft:500 tpot:50") == GoodputSLO(ttft_ms=500.0, tpot_ms=50.0)
    assert GoodputSLO.parse("  e2el:1.5e3 ") == GoodputSLO(e2el_ms=1500.0)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("", "empty"),
        ("ttft", "'ttft' has no ':'"),
        ("itl:5", "unknown goodput SLO key 'itl'"),
        ("ttft:fast", "value 'fast' is not a number"),
        ("ttft:-1", r"ttft:-1\.0 must be a non-negative"),
        ("ttft:inf", "ttft:inf must be a non-negative"),
        ("ttft:1 ttft:2", "'ttft' given twice"),
        ("ttft=500", "'ttft=500' has no ':'"),
    ],
)
def test_goodput_parse_errors_name_the_problem_and_the_expected_form(spec, named):
    with pytest.raises(ValueError, match=named) as raised:
        GoodputSLO.parse(spec)
    assert "milliseconds" in str(raised.value)


def test_goodput_slo_needs_at_least_one_limit():
    with pytest.raises(ValueError, match="at least one"):
        GoodputSLO()


# --- steady state --------------------------------------------------------------------

USERS, REQUEST_S, STAGGER_S, UNTIL_S = 4, 2.0, 0.5, 20.0


def closed_loop_run() -> list[RequestRecord]:
    """4 users joining 0.5 s apart, each sending back to back until t=20; a request lasts 2 s
    and streams one token every 0.25 s (offset 0.125 s so none lands on a window edge):
    16 tok/s while all users are active."""
    records = []
    for user in range(USERS):
        sent = user * STAGGER_S
        while sent < UNTIL_S:
            chunks = [(sent + 0.125 + 0.25 * m, 1) for m in range(8)]
            records.append(rec(len(records), sent, chunks, ended=sent + REQUEST_S, prompt=100))
            sent += REQUEST_S
    return records


def test_steady_window_of_a_closed_loop_starts_when_the_last_user_joins_and_ends_at_the_last_send():
    assert steady_window(closed_loop_run()) == (1.5, 19.5)


def test_window_throughput_is_the_constant_mid_run_rate():
    records = closed_loop_run()
    window = steady_window(records)
    values = summarize(records, window=window).values()
    assert values["duration"] == 18.0
    assert values["output_throughput"] == 16.0  # 4 streams * 4 tok/s
    assert values["total_token_throughput"] == 16.0 + 36 * 100 / 18.0  # first tokens of sends 1.5 .. 19.0
    assert values["mean_e2el_ms"] == 1875.0 and values["std_ttft_ms"] == 0.0
    assert values["request_throughput"] == values["completed"] / 18.0
    assert summarize(records)["output_throughput"].value < 16.0  # ramp-up and drain dilute the whole run


def test_window_counts_a_failed_request_sent_inside_it_and_nothing_else_of_it_or_of_the_warm_up():
    records = closed_loop_run()
    window = steady_window(records)
    noise = [
        rec(9_000, 5.0, [(5.5, 50)], ended=6.0, warmup=True),
        rec(9_001, 5.0, [(5.5, 50)], ended=6.0, expected=51),  # truncated
    ]
    noisy, clean = summarize(records + noise, window=window).values(), summarize(records, window=window).values()
    assert noisy["failed"] == clean["failed"] + 1 == 1
    for key in ("completed", "output_throughput", "total_token_throughput", "request_throughput", "mean_e2el_ms", "p99_ttft_ms"):
        assert noisy[key] == clean[key], key


def test_window_is_half_open():
    records = [rec(0, 0.0, [(1.0, 2), (2.0, 3), (3.0, 5)], ended=3.0, prompt=7)]
    values = summarize(records, window=(1.0, 3.0)).values()
    assert values["total_output_tokens"] == 5  # the chunk at 1.0 counts, the one at 3.0 does not
    assert values["total_input_tokens"] == 7  # first token at 1.0
    assert values["completed"] == 0  # ended at 3.0, the window's end


def test_steady_window_absent_without_a_steady_phase():
    assert steady_window([rec(0, 0.0, [(1.0, 1)])]) is None
    burst = [rec(i, 0.0, [(1.0 + i, 1)]) for i in range(5)]  # all sent at once: only draining
    assert steady_window(burst) is None
    with pytest.raises(ValueError, match="empty window"):
        summarize(burst, window=(1.0, 1.0))



# --- cross check ---------------------------------------------------------------------


def test_cross_check_counts_warmup_and_failed_usage():
    check = cross_check(HAND_RUN, 1034, 14)  # 35 + 999 prompt, 7 + 7 generation
    assert (check.client_prompt, check.client_generation) == (1034, 14)
    assert check.matches is True
    assert "agree" in check.describe()


def test_cross_check_mismatch_explains_requests_without_usage():
    check = cross_check(HAND_RUN, 1100.0, 14.0)
    assert check.matches is False
    assert check.requests_without_usage == 1  # r2
    assert "1034" in check.describe() and "1100" in check.describe() and "no usage" in check.describe()


def test_cross_check_without_server_counters():
    check = cross_check(HAND_RUN, None, None)
    assert check.matches is None and "no token counters" in check.describe()
    assert cross_check(HAND_RUN, None, 15).matches is False
    assert cross_check(HAND_RUN, None, 14).matches is True


# --- client bound --------------------------------------------------------------------


def open_loop(rate: float, n: int = 50, lag: float = 0.0) -> list[RequestRecord]:
    return [rec(i, i / rate, [(i / rate + 0.1, 1)], lag=lag) for i in range(n)]


def test_client_keeping_up_is_not_client_bound():
    assert client_bound_reason(open_loop(10.0), requested_rate=10.0, client_cpu_busy_fraction=0.5) is None
    assert client_bound_reason(open_loop(10.0), requested_rate=math.inf) is None


def test_slow_sending_is_client_bound():
    reason = client_bound_reason(open_loop(9.0), requested_rate=10.0)
    assert reason is not None and "req/s" in reason
    assert client_bound_reason(open_loop(9.6), requested_rate=10.0) is None


def test_scheduling_lag_is_client_bound():
    reason = client_bound_reason(open_loop(10.0, lag=0.2))
    assert reason is not None and "scheduling lag 200.0 ms" in reason
    assert client_bound_reason(open_loop(10.0, lag=0.2), lag_p99_limit_s=0.3) is None


def test_pegged_client_process_is_client_bound():
    reason = client_bound_reason(open_loop(10.0), client_cpu_busy_fraction=0.97)
    assert reason is not None and "busy 97%" in reason
    assert client_bound_reason(open_loop(10.0), client_cpu_busy_fraction=0.97, busy_limit=0.99) is None


def test_warmup_lag_does_not_make_a_run_client_bound():
    records = [*open_loop(10.0), rec(999, -5.0, [(-4.0, 1)], lag=5.0, warmup=True)]
    assert client_bound_reason(records) is None


def test_prompt_lengths_other_than_the_ids_sent_are_named() -> None:
    """Only requests sent as token ids and answered with usage are held to their length."""
    sent = [dataclasses.replace(rec(i, float(i), [(i + 0.1, 1)], prompt=10), expected_prompt_tokens=10) for i in range(4)]
    text = rec(4, 4.0, [(4.1, 1)], prompt=99)  # a text prompt: the server's count is the only one
    no_usage = dataclasses.replace(rec(5, 5.0, status=None, error="refused", prompt=0), expected_prompt_tokens=10)
    assert prompt_lengths_off([*sent, text, no_usage]) is None
    off = dataclasses.replace(sent[2], prompt_tokens=11)
    assert prompt_lengths_off([sent[0], sent[1], off, sent[3], text]) == (
        "1 of 4 request(s) counted other prompt lengths than the token ids sent (request 2: 10 sent, 11 counted)"
    )
