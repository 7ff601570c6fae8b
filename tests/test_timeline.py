"""A run's timeline (core.timeline) and latency distributions (core.summary.latency_quantiles):
what the report draws, from the records and the samplers' points, and kept in the run's JSON."""

from __future__ import annotations

import msgspec
import pytest

from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.core.summary import QUANTILES, latency_quantiles, summarize
from pytest_qwenperf.core.timeline import MAX_BINS, MIN_BIN_S, Timeline
from pytest_qwenperf.measure.timeline import timeline
from pytest_qwenperf.telemetry import Telemetry
from pytest_qwenperf.telemetry.gauges import GaugeSample, MetricsPoller
from tests.test_baseline import make_run
from tests.test_metrics import rec


def at(bins: float) -> float:
    """A clock time ``bins`` of the narrowest bins after 100 s (a short run's bins are that wide)."""
    return 100.0 + bins * MIN_BIN_S


# Two requests: one streams 4 tokens in bins [0.5, 1.5], the other 6 in [2.2, 3.4].
RECORDS = [
    rec(0, at(0), [(at(0.5), 1), (at(1.0), 1), (at(1.5), 2)]),
    rec(1, at(1), [(at(2.2), 2), (at(3.0), 2), (at(3.4), 2)], ended=at(3.5)),
]


def test_output_tokens_land_in_the_bin_their_chunk_arrived_in() -> None:
    found = timeline(RECORDS, {}, None)
    assert found is not None and found.bin_s == MIN_BIN_S
    assert found.series["output_tok_s"] == tuple(tokens / MIN_BIN_S for tokens in (1, 3, 2, 4))
    assert sum(found.series["output_tok_s"]) * found.bin_s == sum(r.completion_tokens for r in RECORDS)


def test_requests_in_flight_are_averaged_over_each_bin() -> None:
    found = timeline(RECORDS, {}, (at(1), at(3)))
    assert found is not None
    # request 0 is open [0, 1.5] bins, request 1 [1, 3.5]
    assert found.series["in_flight"] == (1.0, 1.5, 1.0, 0.5)
    assert found.window == (MIN_BIN_S, 3 * MIN_BIN_S) and found.times() == tuple((i + 0.5) * MIN_BIN_S for i in range(4))


def test_sampled_points_are_the_mean_of_their_bin_and_a_bin_without_one_is_a_gap() -> None:
    points = {"kv_cache_usage": [(at(0.2), 0.1), (at(0.8), 0.3), (at(2.5), 0.5), (99.0, 1.0), (110.0, 1.0)], "power_w": []}
    found = timeline(RECORDS, points, None)
    assert found is not None
    assert found.series["kv_cache_usage"] == (0.2, None, 0.5, None)  # points outside the run are left out
    assert "power_w" not in found.series  # nothing sampled: no series rather than a row of gaps
    assert list(found.series) == ["output_tok_s", "in_flight", "kv_cache_usage"]  # the order of SERIES


def test_a_long_run_keeps_at_most_its_bins_and_every_token() -> None:
    records = [rec(i, float(i), [(i + 0.5, 3)]) for i in range(2000)]
    found = timeline(records, {}, None)
    assert found is not None and len(found.series["output_tok_s"]) <= MAX_BINS and found.bin_s > MIN_BIN_S
    assert sum(found.series["output_tok_s"]) * found.bin_s == pytest.approx(6000, rel=1e-3)


def test_an_unknown_series_is_refused_and_no_records_make_no_timeline() -> None:
    with pytest.raises(ValueError, match=r"unknown timeline series \['gpu_temp'\]"):
        timeline(RECORDS, {"gpu_temp": [(100.0, 50.0)]}, None)
    assert timeline([], {}, None) is None


def test_the_telemetrys_points_are_named_as_the_timeline_names_them() -> None:
    poller = MetricsPoller(["http://127.0.0.1:1"])
    poller.samples += [GaugeSample(at=at(0.5), running=4.0, waiting=None, kv_cache_usage=0.25, counters={})]
    points = Telemetry(gpu=None, cpu=None, server=poller).points()
    assert points == {"running": [(at(0.5), 4.0)], "kv_cache_usage": [(at(0.5), 0.25)]}
    found = timeline(RECORDS, points, None)
    assert found is not None and found.series["running"][0] == 4.0


def test_latency_quantiles_agree_with_the_runs_percentiles() -> None:
    records = [rec(i, float(i), [(i + 0.1 + i / 100, 1), (i + 0.3, 1), (i + 0.4, 1)]) for i in range(50)]
    found = latency_quantiles(records)
    assert set(found) == {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"} and all(len(v) == len(QUANTILES) for v in found.values())
    summary = summarize(records)
    for name in ("ttft", "tpot", "e2el"):
        assert found[f"{name}_ms"][99] == pytest.approx(summary[f"p99_{name}_ms"].value, rel=1e-3)
        assert found[f"{name}_ms"][50] == pytest.approx(summary[f"median_{name}_ms"].value, rel=1e-3)
    assert list(found["ttft_ms"]) == sorted(found["ttft_ms"])
    assert latency_quantiles([rec(0, 0.0, [], status=500, error="boom")]) == {}


def test_a_runs_timeline_and_distributions_survive_its_json() -> None:
    line = timeline(RECORDS, {"running": [(at(0.5), 2.0)]}, (at(1), at(3)))
    data = make_run() | {"timeline": msgspec.to_builtins(line), "distributions": {"ttft_ms": list(range(101))}}
    run = decode_run(data)
    assert run.timeline == line and isinstance(run.timeline, Timeline)
    assert run.distributions["ttft_ms"][100] == 100.0
    assert decode_run(make_run()).timeline is None  # an older run has none
