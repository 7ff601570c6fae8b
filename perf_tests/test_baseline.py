"""Against the reference: no metric may regress beyond its tolerance *and* the measured noise.

The reference is the stored baseline where there is one: ``baselines/<hardware>/<model>/<config>/<workload>.json``,
recorded with ``--qwenperf-update-baselines`` from a passing session. Else it is the history's
recent valid runs of the same identity on this machine (``pytest_qwenperf.history.reference``).
A run with no reference, or one measured on other hardware or with other flags or workload, cannot be
judged: the test is skipped and says which (that is never reported as a regression); so is
one whose recorded environment differs in a field the suite's ``must_match`` names, while
other environment differences are warned about. A run that lost data or ran in wrong
conditions (failed requests, token totals that disagree with the server, a client that could
not keep up, a metric without a value, a shared core or a throttled GPU) fails as
``invalid``, baseline or not. A regression's failure lists its likely causes: what the reference
kept of its setup and telemetry against the run's (``pytest_qwenperf.gate.diagnosis``). A verdict the data cannot decide (``noisy``, ``underpowered``)
after the extra repeats the suite allows (``max_repeats``) warns and never fails.

With a history store, a reference that slides with a slow slide would pass it night after
night: the test also fails while the run's series in the history, the run included, is worse
than its last good level by more than the tolerance (``pytest_qwenperf.history.declines``).
"""

from __future__ import annotations

import warnings

import pytest

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.diagnosis import RANKING, Diagnosis
from pytest_qwenperf.gate.judge import environment_notes, references, render_judgements


def test_no_regression_against_baseline(
    qwenperf_judgements: tuple[Judgement, ...], qwenperf_run: Run, qwenperf_diagnosis: Diagnosis | None
) -> None:
    verdicts = {j.verdict for j in qwenperf_judgements}
    table = render_judgements(qwenperf_judgements)
    declines = "\n".join(d.detail for d in qwenperf_run.declines)
    slid = [f"the history shows a confirmed slide below the last good level (the reference slid with it)\n{declines}"] if declines else []
    if verdicts <= {"no-baseline", "not-comparable"}:
        assert not slid, slid[0]
        pytest.skip(f"nothing to judge against: {qwenperf_judgements[0].detail}" if qwenperf_judgements else "no gated metric measured")
    invalid = sorted({j.reason or "no reason given" for j in qwenperf_judgements if j.verdict == "invalid"})
    assert not invalid, "\n\n".join([f"the run is invalid ({', '.join(invalid)}), so its numbers are no verdict on vLLM\n{table}", *slid])
    causes = f"\n\nlikely causes ({RANKING}):\n" + "\n".join(qwenperf_diagnosis.lines()) if qwenperf_diagnosis else ""
    # A run both beyond its reference and on a slide fails saying both: neither hides the other.
    failed = ([f"slower than the baseline beyond tolerance and noise\n{table}{causes}"] if "regression" in verdicts else []) + slid
    assert not failed, "\n\n".join(failed)
    if "noisy" in verdicts:
        warnings.warn(f"some metrics look worse than the tolerance, but the noise cannot confirm it\n{table}", stacklevel=1)
    stale = [name for name in references(qwenperf_judgements) if "(stale: " in name]
    if stale:
        warnings.warn(f"judged against a stale baseline: record a new one (qwenperf baseline promote)\n{table}", stacklevel=1)
    changed = environment_notes(qwenperf_judgements)
    if changed:
        warnings.warn("the environment differs from the baseline's (the suite allows it):\n" + "\n".join(changed), stacklevel=1)
    if "underpowered" in verdicts:
        warnings.warn(
            f"some metrics could not have shown a change of their tolerance's size: the spread is too wide (MDE above the tolerance)\n{table}",
            stacklevel=1,
        )
