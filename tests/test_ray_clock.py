"""A Ray worker's times onto the driver's clock: the offset read before the run and the one read
after it make a line, so a worker clock that runs fast is corrected over the whole run."""

from __future__ import annotations

import pytest

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.loadgen.ray_workers import ClockLine, ClockReading

# A worker whose clock reads 100 s behind the driver's at its 10 s and gains 2 ms by its 20 s.
LINE = ClockLine(ClockReading(offset=100.0, round_trip=1e-4, at=10.0), ClockReading(offset=99.998, round_trip=2e-4, at=20.0))


def test_times_between_the_readings_take_the_interpolated_offset() -> None:
    assert LINE.drift == pytest.approx(-0.002)
    assert LINE(10.0) == pytest.approx(110.0)
    assert LINE(15.0) == pytest.approx(114.999)  # half-way: half the drift
    assert LINE(20.0) == pytest.approx(119.998)


def test_times_outside_the_readings_keep_the_nearer_offset() -> None:
    assert LINE(5.0) == pytest.approx(105.0)
    assert LINE(30.0) == pytest.approx(129.998)


def test_readings_at_one_instant_apply_the_first_offset() -> None:
    same = ClockLine(ClockReading(1.0, 1e-4, 5.0), ClockReading(1.5, 1e-4, 5.0))
    assert same(7.0) == pytest.approx(8.0) and same.drift == pytest.approx(0.5)


def test_every_time_a_record_holds_is_moved() -> None:
    record = RequestRecord(0, "e", 12.0, 12.0, 18.0, (14.0, 16.0), (1, 1), prompt_tokens=4, completion_tokens=2, status=200)
    moved = LINE.shifted(record)
    assert (moved.scheduled_at, moved.sent_at, moved.ended_at) == pytest.approx((111.9996, 111.9996, 117.9984))
    assert moved.chunk_times == pytest.approx((113.9992, 115.9988))
    assert (moved.prompt_tokens, moved.completion_tokens, moved.chunk_tokens) == (4, 2, (1, 1))
