"""Change points in a metric's series: where its level stepped, by how much, how surely, and what
changed there (the vLLM version either side).

The detection is Apache Otava's (the E-divisive means of its ``analysis`` module: candidate
points by energy statistics, each kept only when a t-test between the segments either side
gives a p-value under ``max_pvalue``), not ours. A series point is one run: the centre of its
repeats (:func:`~pytest_qwenperf.core.stats.centre`). A change is ``worse`` or ``better`` by
the metric's direction, and it is *confirmed* when at least :data:`CONFIRMING` points follow
it and as many precede it: a one-night blip is a change at the last point with nothing after
it, which Otava may report but the gate does not act on.

A series fails (:func:`decline`) while its current level is worse than its last good level by
more than a tolerance: ``qwenperf history --fail-on change`` with the smallest change it keeps,
a session with the suite's tolerance of each metric.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.run import Decline
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.gate.history_store import SeriesPoint

MAX_PVALUE = 0.001
"""A change is kept when the t-test between the segments either side gives p below this (Otava's
default). At 0.01, a series of 14 nights with a 2 % spread got spurious changes of ~2 % beside
the real one, and one real step was placed two nights late."""
MIN_CHANGE = 0.03
"""…and when the level moved by at least this fraction: smaller steps are within a night's noise
on a shared runner (a flat series of 14 nights at a 5 % repeat spread: 6 of 150 had a change at
3 %, 15 of 150 at p < 0.01 and 5 %; a 10 % step was found in 144 of 150)."""
WINDOW = 30
"""Otava's window: change points are looked for in windows of this many points (a history of
nightly runs sees a month at a time)."""
CONFIRMING = 2
"""Points after a change that confirm it."""
CURRENT = 3
"""The current level is the mean of the last this many runs since the latest confirmed change:
during a slide, the mean of the whole last segment lags behind it (on a synthetic slide of
-2 % a night after 20 flat ones, six seeds, the segment's mean passed a 10 % tolerance 6 to 10
nights in, the last three runs 6 to 7 nights in; the loss itself passes 10 % at night 6)."""


@dataclass(frozen=True)
class Change:
    """A step in a series at ``index`` (the first point of the new level)."""

    index: int
    before: float  # the mean of the segment before
    after: float  # the mean of the segment after
    pvalue: float
    direction: str  # "worse" or "better", by the metric's direction
    points_after: int
    version_before: str | None
    version_after: str | None
    started_after: str | None  # when the first run of the new level started

    @property
    def change(self) -> float:
        """The relative change of the level, ``after / before - 1``."""
        return self.after / self.before - 1 if self.before else float("nan")

    @property
    def confidence(self) -> float:
        return 1 - self.pvalue

    @property
    def confirmed(self) -> bool:
        """At least :data:`CONFIRMING` runs either side: after it, the new level held; before it, the
        old level was a level, not one run (a session's first repeats after a boot can run slow, and
        Otava splits three runs after the first)."""
        return self.points_after >= CONFIRMING and self.index >= CONFIRMING


def levels(points: Sequence[SeriesPoint]) -> list[float]:
    """One value per run: the centre of its repeats (runs without a value are left out by the caller)."""
    return [centre(p.values) for p in points]


def change_points(
    points: Sequence[SeriesPoint], name: str, *, max_pvalue: float = MAX_PVALUE, min_change: float = MIN_CHANGE, window: int = WINDOW
) -> tuple[Change, ...]:
    """The changes Otava finds in the series of metric ``name``'s ``points`` (runs without a value are skipped).

    Otava (the ``history`` extra) is imported here, on the first series long enough to look at."""
    kept = [p for p in points if p.values]
    if len(kept) < 3:
        return ()
    from otava.analysis import compute_change_points

    series = levels(kept)
    direction = metric(name).direction
    found, _weak = compute_change_points(series, window_len=window, max_pvalue=max_pvalue, min_magnitude=min_change)
    changes = []
    for cp in found:
        at = int(cp.index)
        before, after = float(cp.stats.mean_1), float(cp.stats.mean_2)
        worse = after < before if direction == "higher" else after > before
        changes.append(
            Change(
                index=at,
                before=before,
                after=after,
                pvalue=float(cp.stats.pvalue),
                direction="worse" if worse else "better",
                points_after=len(kept) - at,
                version_before=kept[at - 1].vllm_version,
                version_after=kept[at].vllm_version,
                started_after=kept[at].started,
            )
        )
    return tuple(changes)


def decline(points: Sequence[SeriesPoint], changes: Sequence[Change], name: str, tolerance: float) -> Decline | None:
    """Whether metric ``name``'s series is worse than its last good level by more than ``tolerance``.

    The confirmed ``changes`` (of :func:`change_points` on ``points``) cut the series into levels,
    each the mean of its runs' centres; the current level is the mean of the last
    :data:`CURRENT` runs of the last one (unconfirmed runs at the end count in it). The last good
    level is the level before the earliest step for the worse that the current level has not
    recovered from. Not the latest change alone: a newer step
    (or an unconfirmed one) would hide an older one, and a partial recovery, a step for the
    better that stops short, would pass a level still below where it was."""
    confirmed = sorted((c for c in changes if c.confirmed), key=lambda c: c.index)
    if not confirmed:
        return None
    series = levels([p for p in points if p.values])
    bounds = [0, *(c.index for c in confirmed), len(series)]
    segments = [fmean(series[a:b]) for a, b in itertools.pairwise(bounds)]
    higher = metric(name).direction == "higher"
    current = fmean(series[max(bounds[-2], len(series) - CURRENT) :])
    for at, change in enumerate(confirmed):
        good = segments[at]
        worse_by = (1 - current / good if higher else current / good - 1) if good else 0.0
        if change.direction == "worse" and worse_by > tolerance:
            known = change.version_before or change.version_after
            versions = f"{change.version_before or 'unknown'} → {change.version_after or 'unknown'}" if known else None
            return Decline(
                metric=name, good=good, current=current, tolerance=tolerance, step=change.index + 1,
                since=change.started_after, versions=versions,
            )  # fmt: skip
    return None
