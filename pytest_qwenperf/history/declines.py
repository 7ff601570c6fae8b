"""What a run's history says of it once it is measured: no boiling frog, and how far this runner's
sessions differ.

A slow slide of small nightly losses passes a reference of the last few runs, because the
reference slides too. The change points of the whole series see it: the session fails on a
gated metric whose current level is worse than its last good level by more than the suite's
tolerance (:func:`~pytest_qwenperf.history.changes.decline`), the rule of ``qwenperf history
--fail-on change``. The series are the run's comparable history (:func:`~pytest_qwenperf.history.reference.comparable_runs`)
and the run itself when it is valid: an invalid run is no level of vLLM's.

The runs of the history reference's window also say how far this runner's sessions differ
(:meth:`~pytest_qwenperf.history.reference.HistoryReference.noise`): the run keeps it in its JSON,
so that ``qwenperf compare`` of this session against another single one knows what their repeats
cannot show.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.run import Decline, Run
from pytest_qwenperf.history.changes import change_points, decline
from pytest_qwenperf.history.reference import comparable_runs, gated_series, reading, window_of


def judged_by_history(where: str, run: Run, *, valid: bool, window: int) -> Run:
    """``run`` with its :attr:`~pytest_qwenperf.core.run.Run.declines` and
    :attr:`~pytest_qwenperf.core.run.Run.runner_noise` from the store at ``where`` (unchanged where
    no store was made yet), read once; a store that cannot be read raises
    :class:`~pytest_qwenperf.gate.baseline.BaselineError`."""
    with reading(where) as store:  # its errors, and a missing change-point detection, raised as one
        if store is None:
            return run
        past = comparable_runs(store, run)
        found = _declines(past, run, valid=valid)
        reference = window_of(past, window)
    return msgspec.structs.replace(run, declines=found, runner_noise=reference.noise() if reference else {})


def _declines(past: Sequence[Run], run: Run, *, valid: bool) -> tuple[Decline, ...]:
    """The gated metrics of ``run``'s history ``past`` (with ``run`` when it is ``valid``) that are
    worse than their last good level."""
    runs = [*past, run] if valid else list(past)
    tolerances = run.tolerances or {}
    found = []
    for name, _valued, points in gated_series(runs):
        tolerance = tolerances.get(name, metric(name).tolerance)
        assert tolerance is not None  # gated metrics have one
        judged = decline(points, change_points(points, name), name, tolerance)
        if judged is not None:
            found.append(judged)
    return tuple(found)
