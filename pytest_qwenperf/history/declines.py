"""No boiling frog: a run's history, the run included, judged on its levels rather than on a
window that slides with it.

A slow slide of small nightly losses passes a reference of the last few runs, because the
reference slides too. The change points of the whole series see it: the session fails on a
gated metric whose current level is worse than its last good level by more than the suite's
tolerance (:func:`~pytest_qwenperf.history.changes.decline`), the rule of ``qwenperf history
--fail-on change``. The series are the run's comparable history (:func:`~pytest_qwenperf.history.reference.comparable_runs`)
and the run itself when it is valid: an invalid run is no level of vLLM's.
"""

from __future__ import annotations

from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.run import Decline, Run
from pytest_qwenperf.history.changes import change_points, decline
from pytest_qwenperf.history.reference import comparable_runs, gated_series, reading


def history_declines(where: str, run: Run, *, valid: bool) -> tuple[Decline, ...]:
    """The gated metrics of ``run``'s history in the store at ``where`` (with ``run`` when it is
    ``valid``) that are worse than their last good level; a store that cannot be read raises
    :class:`~pytest_qwenperf.gate.baseline.BaselineError`."""
    with reading(where) as store:  # its errors, and a missing change-point detection, raised as one
        past = comparable_runs(store, run) if store is not None else []
        runs = [*past, run] if valid else past
        tolerances = run.tolerances or {}
        found = []
        for name, _valued, points in gated_series(runs):
            tolerance = tolerances.get(name, metric(name).tolerance)
            assert tolerance is not None  # gated metrics have one
            judged = decline(points, change_points(points, name), name, tolerance)
            if judged is not None:
                found.append(judged)
    return tuple(found)
