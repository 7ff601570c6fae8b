"""Change points in series of runs: Otava's detection, read by our rules (direction by the metric,
confirmation by the runs after, the vLLM versions either side). The series are made here with a
known step, so what must be found is known; the same rule on real sessions is in docs/history.md."""

from __future__ import annotations

import random

import pytest

from pytest_qwenperf.gate.history_store import SeriesPoint
from pytest_qwenperf.history.changes import Change, change_points, failing


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
    changes = change_points(series(levels, seed=seed, versions=versions), "output_throughput")
    worst = failing(changes)
    assert worst is not None, changes
    assert abs(worst.index - k) <= 1
    assert worst.change == pytest.approx(-0.15, abs=0.05)
    assert worst.direction == "worse" and worst.points_after == 14 - worst.index
    if worst.index == k:
        assert (worst.version_before, worst.version_after) == ("0.31.0", "0.32.0")


@pytest.mark.parametrize("seed", range(10))
def test_a_flat_series_has_no_change_that_fails(seed: int) -> None:
    assert failing(change_points(series([5_000.0] * 14, seed=seed), "output_throughput")) is None


def test_a_rise_in_latency_is_worse_and_a_rise_in_throughput_better() -> None:
    levels = [20.0] * 7 + [24.0] * 7
    latency = change_points(series(levels), "p99_tpot_ms")
    throughput = change_points(series(levels), "output_throughput")
    assert [c.direction for c in latency] == ["worse"] and failing(latency) is not None
    assert [c.direction for c in throughput] == ["better"] and failing(throughput) is None


def test_a_step_at_the_last_night_is_not_confirmed_and_does_not_fail() -> None:
    levels = [5_000.0] * 13 + [3_500.0]
    changes = change_points(series(levels), "output_throughput")
    assert failing(changes) is None
    assert all(c.points_after < 2 for c in changes if c.index >= 13)


def change(index: int, direction: str, points_after: int) -> Change:
    return Change(index, 100.0, 90.0 if direction == "worse" else 110.0, 1e-4, direction, points_after, "a", "b", None)


def test_the_latest_change_decides() -> None:
    recovered = [change(5, "worse", 9), change(9, "better", 5)]
    assert failing(recovered) is None
    assert failing([change(3, "better", 11), change(9, "worse", 5)]) == change(9, "worse", 5)
    assert failing([change(5, "worse", 9), change(13, "worse", 1)]) is None  # the latest is unconfirmed
    assert failing([]) is None


@pytest.mark.parametrize("seed", range(5))
def test_a_regression_already_recovered_from_does_not_fail(seed: int) -> None:
    levels = [5_000.0] * 5 + [4_000.0] * 4 + [5_000.0] * 5
    assert failing(change_points(series(levels, seed=seed), "output_throughput")) is None


def test_runs_without_values_are_skipped_and_short_series_have_no_change() -> None:
    points = series([5_000.0] * 2)
    assert change_points(points, "output_throughput") == ()
    empty = SeriesPoint("none", None, "2026-11-30", None, ())
    stepped = series([5_000.0] * 7 + [4_000.0] * 7)
    changes = change_points([*stepped[:7], empty, *stepped[7:]], "output_throughput")
    assert [(c.index, c.points_after) for c in changes] == [(7, 7)]  # indices of the runs with values
