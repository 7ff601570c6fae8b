"""Ramp-up before the measured phase: an open loop's warm-up at a rising rate, a closed loop's in
steps of rising concurrency; their schedules, checks and suite-file keys, and the client following
them against the stand-in stream source (tests/stream_source.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.loadgen.arrivals import ArrivalError, ClosedLoop, OpenLoop
from pytest_qwenperf.loadgen.assignment import Assignment, LoadOptions
from pytest_qwenperf.loadgen.client import run_load_sync
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.workers import run_load_in_workers, share_of
from tests.stream_source import MODEL, StreamSource, stream_source
from tests.suite_files import HEADER, refused, suite_at


@pytest.fixture(scope="module")
def source() -> Iterator[StreamSource]:
    with stream_source() as src:
        yield src


def spec(index: int, **schedule: Any) -> RequestSpec:
    return RequestSpec(index, 2, prompt=(1, 2, 3), sampling=(("temperature", 0.0), ("x_schedule", {"id": index, **schedule})))


def most_at_once(records: Sequence[RequestRecord]) -> int:
    """The most of ``records`` in flight at any moment."""
    events = sorted([(r.sent_at, 1) for r in records] + [(r.ended_at, -1) for r in records])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


# --- schedules -------------------------------------------------------------------------


def test_a_linear_ramp_rises_from_zero_to_the_rate() -> None:
    """Request i of n goes when the expected count of a rate rising linearly to ``rate`` reaches i:
    at T sqrt(i / n), the ramp lasting T = 2 n / rate."""
    ramp = OpenLoop(rate=40, ramp="linear").ramp_offsets(10)
    assert ramp == pytest.approx([0.5 * math.sqrt(i / 10) for i in range(1, 11)], rel=1e-12)
    assert ramp[-1] == 0.5
    gaps = [b - a for a, b in pairwise(ramp)]
    assert all(b < a for a, b in pairwise(gaps))  # ever faster
    assert 1 / 40 < gaps[-1] < 1.1 / 40  # near the full rate at its end
    assert OpenLoop(rate=40, ramp="linear").ramp_offsets(0) == []


def test_a_stepped_ramp_has_equal_steps_each_at_its_share_of_the_rate() -> None:
    """Two steps at 20 and 40 requests/s, each 1/6 s long: 10 requests end at 1/3 s."""
    ramp = OpenLoop(rate=40, ramp="steps", ramp_steps=2).ramp_offsets(10)
    expected = [0.05, 0.10, 0.15, 1 / 6 + (4 - 10 / 3) / 40, *(1 / 6 + (i - 10 / 3) / 40 for i in range(5, 11))]
    assert ramp == pytest.approx(expected, abs=1e-12)
    assert ramp[-1] == pytest.approx(1 / 3, abs=1e-12)
    four = OpenLoop(rate=100, ramp="steps", ramp_steps=4).ramp_offsets(100)
    step_s = four[-1] / 4
    per_step = [sum(1 for t in four if k * step_s < t <= (k + 1) * step_s + 1e-12) for k in range(4)]
    assert per_step == [10, 20, 30, 40]  # the count in step k is in proportion to its rate k / 4


def test_the_measured_schedule_is_unchanged_by_a_ramp() -> None:
    for distribution in ("poisson", "constant"):
        plain = OpenLoop(rate=20, distribution=distribution, seed=2)
        ramped = OpenLoop(rate=20, distribution=distribution, seed=2, ramp="steps", ramp_steps=3)
        assert ramped.offsets(50) == plain.offsets(50)


def test_a_closed_loop_raises_its_concurrency_in_steps() -> None:
    """Step k runs ceil(c k / steps) lanes; its share of the warm-up's sends is in proportion to them."""
    assert ClosedLoop(4, ramp_steps=2).warmup_lanes(12) == ((0, 2), (4, 4))
    assert ClosedLoop(8, ramp_steps=4).warmup_lanes(20) == ((0, 2), (2, 4), (6, 6), (12, 8))
    assert ClosedLoop(3, ramp_steps=2).warmup_lanes(10) == ((0, 2), (4, 3))
    assert ClosedLoop(3).warmup_lanes(10) == ((0, 3),)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: OpenLoop(rate=5, ramp="exponential"), r"^ramp: expected one of \['linear', 'steps'\], got 'exponential'$"),
        (lambda: OpenLoop(rate=5, ramp="steps"), r"^ramp_steps: expected a whole number of steps >= 2 \(ramp = 'steps' needs them\), got None$"),
        (lambda: OpenLoop(rate=5, ramp="steps", ramp_steps=1), r"^ramp_steps: expected a whole number of steps >= 2"),
        (lambda: OpenLoop(rate=5, ramp="linear", ramp_steps=3), r"^ramp_steps: expected no steps unless ramp is 'steps', got 3$"),
        (lambda: OpenLoop(rate=5, ramp_steps=3), r"^ramp_steps: expected no steps unless ramp is 'steps', got 3$"),
        (lambda: ClosedLoop(4, ramp_steps=1), r"^ramp_steps: expected a whole number of warm-up steps >= 2, got 1$"),
        (lambda: ClosedLoop(4, ramp_steps=True), r"^ramp_steps: expected a whole number of warm-up steps >= 2, got True$"),
    ],
)
def test_bad_ramps_name_the_field(make: Any, message: str) -> None:
    with pytest.raises(ArrivalError, match=message):
        make()


# --- sending ---------------------------------------------------------------------------


@pytest.mark.parametrize("ramp", [{"ramp": "linear"}, {"ramp": "steps", "ramp_steps": 2}])
def test_an_open_loop_sends_its_warmup_on_the_ramp_then_measures_at_the_full_rate(source: StreamSource, ramp: dict[str, Any]) -> None:
    arrival = OpenLoop(rate=40, distribution="constant", **ramp)
    specs = [spec(i, itl_ms=5) for i in range(20)]
    load = run_load_sync(source.urls, MODEL, specs, arrival, LoadOptions(warmup=10))
    assert len(load.records) == 20 and all(r.ok for r in load.records)
    warm = sorted((r for r in load.records if r.warmup), key=lambda r: r.index)
    measured = sorted((r for r in load.records if not r.warmup), key=lambda r: r.index)
    assert [r.index for r in warm] == list(range(10))  # the ramp's requests are warm-up: never in results
    offsets = arrival.ramp_offsets(10)
    start = load.started_at - offsets[-1]  # the measured phase starts where the ramp ends
    assert [r.scheduled_at - start for r in warm] == pytest.approx(offsets, abs=1e-9)
    assert [r.scheduled_at - load.started_at for r in measured] == pytest.approx(arrival.offsets(10), abs=1e-9)
    # Never early; half a second late would be the schedule ignored (timer precision is benchmarks/fidelity.py's)
    assert all(0 <= r.scheduling_lag < 0.5 for r in load.records)
    assert load.requested_rate == 40


def test_a_closed_loop_steps_up_its_lanes_during_the_warmup(source: StreamSource) -> None:
    """Four lanes in two steps over 12 warm-up requests: the first 4 go two at a time (two lanes:
    a lane sends its next request once its last ended), then four lanes run."""
    specs = [spec(i, ttft_ms=100) for i in range(16)]
    load = run_load_sync(source.urls, MODEL, specs, ClosedLoop(4, ramp_steps=2), LoadOptions(warmup=12, timeout_s=30))
    assert len(load.records) == 16 and all(r.ok for r in load.records)
    warm = [r for r in load.records if r.warmup]
    assert sorted(r.index for r in warm) == list(range(12))
    assert most_at_once([r for r in warm if r.index < 4]) == 2
    assert most_at_once(warm) == 4
    assert most_at_once([r for r in load.records if not r.warmup]) == 4


def test_workers_share_the_ramp_and_keep_its_length(source: StreamSource) -> None:
    arrival = OpenLoop(rate=40, distribution="constant", ramp="linear")
    specs = [spec(i) for i in range(16)]
    whole = Assignment.of(source.urls, MODEL, specs, arrival, LoadOptions(warmup=8))
    assert whole.ramp is not None and whole.ramp == tuple(arrival.ramp_offsets(8)) and whole.ramp_s == 0.4
    for k in range(2):
        share = share_of(whole, 2, k)
        assert share.ramp == whole.ramp[k::2] and share.ramp_s == whole.ramp_s  # the measured phase starts at the whole ramp's end
        assert [unit[0][0] for unit in share.warmup] == list(range(k, 8, 2))
    load = run_load_in_workers(2, source.urls, MODEL, specs, arrival, LoadOptions(warmup=8))
    assert len(load.records) == 16 and all(r.ok for r in load.records)
    assert sum(r.warmup for r in load.records) == 8
    assert all(r.sent_at >= load.started_at for r in load.records if not r.warmup)


# --- suite files -----------------------------------------------------------------------

SUITE = HEADER + """
[[workload]]
name = "open"
kind = "random"
input_len = 16
output_len = 4
num_prompts = 40
warmup = 20
load = { rate = 20, ramp = "steps", ramp_steps = 4 }

[[workload]]
name = "closed"
kind = "random"
input_len = 16
output_len = 4
num_prompts = 40
warmup = 20
load = { concurrency = 8, ramp_steps = 2 }
"""


def test_a_suite_ramps_either_loop(tmp_path: Path) -> None:
    opened, closed = suite_at(tmp_path, SUITE).workloads
    assert opened.arrival == OpenLoop(rate=20, ramp="steps", ramp_steps=4)
    assert closed.arrival == ClosedLoop(8, ramp_steps=2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('ramp = "steps", ramp_steps = 4', 'ramp = "exponential"'), r"workload 'open'.load.ramp: expected one of \['linear', 'steps'\], got 'exponential'$"),
        (('ramp = "steps", ramp_steps = 4', 'ramp = "linear", ramp_steps = 4'), r"workload 'open'.load.ramp_steps: expected no steps unless ramp is 'steps', got 4$"),
        (('ramp_steps = 4', 'ramp_steps = 1.5'), r"workload 'open'.load.ramp_steps: expected a whole number of steps >= 2 \(ramp = 'steps' needs them\), got 1.5$"),
        (("concurrency = 8, ramp_steps = 2", "concurrency = 8, ramp_steps = 0"), r"workload 'closed'.load.ramp_steps: expected a whole number of warm-up steps >= 2, got 0$"),
        (("concurrency = 8, ramp_steps = 2", 'concurrency = 8, ramp = "linear"'), r"workload 'closed'.load.ramp: unknown key for a closed loop \(concurrency = N\); expected only \['concurrency', 'ramp_steps'\]$"),
        (("warmup = 20\nload = { rate", "warmup = 0\nload = { rate"), r"workload 'open'.warmup: expected warm-up requests \(>= 1\) for load.ramp to raise the load over, got 0$"),
        (("warmup = 20\nload = { concurrency", "load = { concurrency"), r"workload 'closed'.warmup: expected warm-up requests \(>= 1\) for load.ramp_steps to raise the load over, got 0$"),
    ],
)
def test_a_bad_ramp_in_a_suite_names_the_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    refused(tmp_path, SUITE.replace(*change, 1), message)
