"""Change points in series of runs: Otava's detection, read by our rules (direction by the metric,
confirmation by the runs after, the vLLM versions either side). The series are made here with a
known step, so what must be found is known; the same rule on real sessions is in docs/history.md."""

from __future__ import annotations

import random

import pytest

from pytest_qwenperf.core.run import Decline
from pytest_qwenperf.gate.history_store import SeriesPoint
from pytest_qwenperf.history.changes import MIN_CHANGE, Change, change_points, decline


def judged(points: list[SeriesPoint], tolerance: float = MIN_CHANGE, name: str = "output_throughput") -> object:
    """The rule of ``qwenperf history --fail-on change`` (a session's uses the suite's tolerance)."""
    return decline(points, change_points(points, name), name, tolerance)


def series(levels: list[float], *, spread: float = 0.02, seed: int = 1, versions: list[str] | None = None) -> list[SeriesPoint]:
    """Runs of three repeats each around ``levels`` (relative noise ``spread``), one a night."""
    rng = random.Random(seed)
    return [
        SeriesPoint(
            run_key=f"run{i}",
            started=f"2026-11-{i + 1:02d}T02:00:00+00:00",
            recorded_at="2026-11-30T00:00:00+00:00",
            vllm_version=(versions or ["0.31.0"] * len(levels))[i],
            values=tuple(level * (1 + rng.gauss(0, spread)) for _ in range(3)),
        )
        for i, level in enumerate(levels)
    ]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [4, 7, 10])
def test_a_step_down_in_throughput_is_found_at_its_night_as_a_confirmed_change_for_the_worse(seed: int, k: int) -> None:
    levels = [5_000.0] * k + [4_250.0] * (14 - k)  # -15 %
    versions = ["0.31.0"] * k + ["0.32.0"] * (14 - k)
    points = series(levels, seed=seed, versions=versions)
    worst = [c for c in change_points(points, "output_throughput") if c.direction == "worse" and c.confirmed]
    assert len(worst) == 1, worst
    assert abs(worst[0].index - k) <= 1
    assert worst[0].change == pytest.approx(-0.15, abs=0.05)
    assert worst[0].points_after == 14 - worst[0].index
    if worst[0].index == k:
        assert (worst[0].version_before, worst[0].version_after) == ("0.31.0", "0.32.0")
    found = judged(points)
    assert isinstance(found, Decline) and found.step == worst[0].index + 1
    assert found.change == pytest.approx(-0.15, abs=0.05) and found.good == pytest.approx(5_000.0, rel=0.03)


@pytest.mark.parametrize("seed", range(10))
def test_a_flat_series_has_no_change_that_fails(seed: int) -> None:
    assert judged(series([5_000.0] * 14, seed=seed)) is None


def test_a_rise_in_latency_is_worse_and_a_rise_in_throughput_better() -> None:
    levels = [20.0] * 7 + [24.0] * 7
    latency = change_points(series(levels), "p99_tpot_ms")
    throughput = change_points(series(levels), "output_throughput")
    assert [c.direction for c in latency] == ["worse"] and judged(series(levels), name="p99_tpot_ms") is not None
    assert [c.direction for c in throughput] == ["better"] and judged(series(levels)) is None


def test_a_step_at_the_last_night_is_not_confirmed_and_does_not_fail() -> None:
    levels = [5_000.0] * 13 + [3_500.0]
    changes = change_points(series(levels), "output_throughput")
    assert judged(series(levels)) is None
    assert all(c.points_after < 2 for c in changes if c.index >= 13)


def change(index: int, direction: str, points_after: int) -> Change:
    return Change(index, 100.0, 90.0 if direction == "worse" else 110.0, 1e-4, direction, points_after, "a", "b", None)


def flat(levels: list[float]) -> list[SeriesPoint]:
    """Runs at exactly ``levels``, so the levels the rule reads are known."""
    return series(levels, spread=0.0)


def test_the_level_before_the_earliest_unrecovered_step_for_the_worse_is_the_last_good_one() -> None:
    recovered = flat([100.0] * 5 + [90.0] * 4 + [100.0] * 5)
    assert decline(recovered, [change(5, "worse", 9), change(9, "better", 5)], "output_throughput", 0.03) is None
    partial = flat([100.0] * 5 + [88.0] * 4 + [94.0] * 5)
    found = decline(partial, [change(5, "worse", 9), change(9, "better", 5)], "output_throughput", 0.03)
    assert found is not None and (found.good, found.current, found.step) == (100.0, 94.0, 6)
    assert decline(partial, [change(5, "worse", 9), change(9, "better", 5)], "output_throughput", 0.07) is None
    gained_and_lost = flat([100.0] * 3 + [110.0] * 6 + [99.0] * 5)
    found = decline(gained_and_lost, [change(3, "better", 11), change(9, "worse", 5)], "output_throughput", 0.03)
    assert found is not None and found.good == 110.0  # the gain is the good level the loss is measured from
    two_steps = flat([100.0] * 5 + [96.0] * 4 + [92.0] * 5)  # each step under 5 %, together 8 %
    found = decline(two_steps, [change(5, "worse", 9), change(9, "worse", 5)], "output_throughput", 0.05)
    assert found is not None and (found.good, found.step) == (100.0, 6)
    unconfirmed = flat([100.0] * 5 + [90.0] * 8 + [80.0])
    found = decline(unconfirmed, [change(5, "worse", 9), change(13, "worse", 1)], "output_throughput", 0.03)
    assert found is not None and found.step == 6  # a newer, unconfirmed step hides nothing
    assert decline(flat([100.0] * 14), [], "output_throughput", 0.03) is None


@pytest.mark.parametrize("seed", range(5))
def test_a_regression_already_recovered_from_does_not_fail(seed: int) -> None:
    levels = [5_000.0] * 5 + [4_000.0] * 4 + [5_000.0] * 5
    assert judged(series(levels, seed=seed)) is None


@pytest.mark.parametrize("seed", range(5))
def test_a_partial_recovery_fails_while_the_level_is_below_the_last_good_one(seed: int) -> None:
    levels = [5_000.0] * 10 + [4_400.0] * 8 + [4_700.0] * 8  # -12 %, then +6.8 %: still -6 %
    found = judged(series(levels, seed=seed))
    assert isinstance(found, Decline) and found.good == pytest.approx(5_000.0, rel=0.02)
    assert found.change == pytest.approx(-0.06, abs=0.025)


@pytest.mark.parametrize("seed", range(6))
def test_a_slide_of_two_percent_a_night_fails_within_a_night_or_two_of_passing_the_tolerance(seed: int) -> None:
    """20 flat nights, then -2 % a night: a window of the last runs slides with it; the levels do not.
    The loss passes 10 % at night 6; the rule must see it by night 8 and not before night 5."""
    first = None
    for night in range(1, 11):
        points = series([5_000.0] * 20 + [5_000.0 * (1 - 0.02 * k) for k in range(1, night + 1)], seed=seed)
        if judged(points, tolerance=0.10) is not None:
            first = night
            break
    assert first is not None and 5 <= first <= 8, first


def test_a_newer_step_does_not_hide_an_older_one() -> None:
    """A slide of -2 % a night found as two confirmed steps for the worse, then a third step at the
    last night (one run after it, unconfirmed): the latest change no longer decides."""
    slide = [5_000.0 * (1 - 0.02 * k) for k in range(1, 11)]
    points = series([5_000.0] * 20 + slide + [slide[-1] * 0.7], seed=9)
    changes = sorted(change_points(points, "output_throughput"), key=lambda c: c.index)
    assert [(c.direction, c.confirmed) for c in changes] == [("worse", True), ("worse", True), ("worse", False)], changes
    found = judged(points)
    assert isinstance(found, Decline) and found.step == changes[0].index + 1
    assert found.good == pytest.approx(5_000.0, rel=0.02)


def test_runs_without_values_are_skipped_and_short_series_have_no_change() -> None:
    points = series([5_000.0] * 2)
    assert change_points(points, "output_throughput") == ()
    empty = SeriesPoint("none", None, "2026-11-30", None, ())
    stepped = series([5_000.0] * 7 + [4_000.0] * 7)
    changes = change_points([*stepped[:7], empty, *stepped[7:]], "output_throughput")
    assert [(c.index, c.points_after) for c in changes] == [(7, 7)]  # indices of the runs with values
    found = judged([*stepped[:7], empty, *stepped[7:]])
    assert isinstance(found, Decline) and found.step == 8
