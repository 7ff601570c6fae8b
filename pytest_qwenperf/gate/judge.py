"""Verdicts on whole runs: every gated metric of a run against its baseline or another run."""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from collections.abc import Sequence

import msgspec

from pytest_qwenperf.core.environment import Environment, must_match_violations
from pytest_qwenperf.core.metrics import SCALING, gate_order, metric
from pytest_qwenperf.core.run import CLIENT_BOUND, FAILED_REQUESTS, NO_VALUE, TOKEN_MISMATCH, Loss, Run
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.tables import format_table
from pytest_qwenperf.core.verdict import (
    DEFAULT_CONFIDENCE,
    MIN_SESSIONS,
    UNDECIDED,
    Hearing,
    Judgement,
    Later,
    SessionSpread,
    Side,
    Verdict,
    judge,
    sessions_known,
)
from pytest_qwenperf.gate.baseline import Baseline, PooledBaseline, StoredMetric, baseline_from_run

# ------------------------------------------------------------------ a run


def losses(run: Run, side: str = "run") -> tuple[Loss, ...]:
    """What makes every number of ``run`` untrustworthy; ``side`` names it ("run", "reference")."""
    suffix = "" if side == "run" else f" ({side})"
    found = []
    failed = run.failed_requests
    if failed > 0:
        found.append(Loss(reason=f"{FAILED_REQUESTS}{suffix}", detail=f"{failed} request(s) of the {side} failed"))
    if run.token_check.matches is False:
        detail = f"the {side}'s client and server token totals disagree ({run.token_check.detail})"
        found.append(Loss(reason=f"{TOKEN_MISMATCH}{suffix}", detail=detail))
    if run.client_bound is not None:
        detail = f"the {side}'s client could not keep up, so its numbers measure the client, not vLLM ({run.client_bound})"
        found.append(Loss(reason=f"{CLIENT_BOUND}{suffix}", detail=detail))
    found += [Loss(reason=f"{loss.reason}{suffix}", detail=f"the {side}'s {loss.detail}") for loss in run.conditions]
    return tuple(found)


def _unjudged(
    name: str, stored: StoredMetric | None, current: Sequence[float], verdict: Verdict, detail: str, *, ratio: bool
) -> Judgement:
    """A judgement that is not a comparison; unit, direction and tolerance as stored, else the defaults."""
    spec = stored or metric(name)
    assert spec.tolerance is not None  # runs only carry gated metrics
    base = stored.value if stored else None
    now = centre(current) if current else None
    judged_ratio = now / base if ratio and base and now is not None else None
    return Judgement(name, spec.unit, spec.direction, base, now, judged_ratio, spec.tolerance, verdict, detail)


def _invalid(j: Judgement, found: Sequence[Loss]) -> Judgement:
    """``j`` made invalid by ``found``: the reasons joined for the table cell, the details for the notes."""
    reason = ", ".join(dict.fromkeys(loss.reason for loss in found))
    return dataclasses.replace(j, verdict="invalid", reason=reason, detail="; ".join(loss.detail for loss in found))


def _expected(name: str, lost: dict[str, str]) -> bool:
    """Whether a run should have ``name`` when its baseline has it: every gated metric but a
    scaling efficiency it never measured (a published multi-node figure)."""
    return name in lost or not SCALING.matches(name)


def judge_run(
    baseline: Baseline | None, run: Run, *, confidence: float = DEFAULT_CONFIDENCE, later: Later | None = None
) -> tuple[Judgement, ...]:
    """Every gated metric of ``run`` against ``baseline``.

    The stored direction and tolerance of each metric are used. A run that lost data is
    ``invalid`` for every metric, whatever its baseline (see the module docstring); so is
    a metric the comparable baseline has and the run has no value for. Scaling
    efficiencies only the baseline has (published multi-node figures) are not judged:
    the run did not measure them.
    """
    found = losses(run)
    gated, lost = run.gated_samples(), run.lost_values()
    differences = baseline.identity.differences(run.identity.baseline()) if baseline else ()
    allowed: tuple[str, ...] = ()
    if baseline is not None and not differences:
        changed = environment_differences(baseline.context.environment, run)
        conflicts = must_match_violations(changed, run.must_match)
        differences = tuple(f"environment {d} (the suite's must_match)" for d in conflicts)
        allowed = tuple(d for d in changed.values() if d not in conflicts)
    names = set(gated)
    if baseline is not None and not differences:
        names |= {name for name in baseline.metrics if name not in names and _expected(name, lost)}
    judgements = []
    for name in gate_order(names):
        samples = gated.get(name, ())
        stored = baseline.metrics.get(name) if baseline else None
        if found:
            judgements.append(_invalid(_unjudged(name, stored, samples, "invalid", "", ratio=True), found))
        elif baseline is None:
            judgements.append(_unjudged(name, None, samples, "no-baseline", "no reference for this run", ratio=False))
        elif differences:
            detail = "not comparable (baseline vs run): " + "; ".join(differences)
            judgements.append(_unjudged(name, stored, samples, "not-comparable", detail, ratio=False))
        elif stored is None:
            judgements.append(_unjudged(name, None, samples, "no-baseline", "the baseline has no value for it", ratio=False))
        elif not samples:
            where = lost.get(name, "not in its JSON")
            loss = Loss(reason=NO_VALUE, detail=f"the run has no value for it ({where}); the baseline has one")
            judgements.append(_invalid(_unjudged(name, stored, samples, "invalid", "", ratio=True), (loss,)))
        else:
            counts = run.sessions_of(name, len(samples))  # one session unless the run pooled several
            hearing = Hearing(
                name,
                Side(stored.samples, stored.sessions),
                Side(samples, counts),
                direction=stored.direction,
                tolerance=stored.tolerance,
                unit=stored.unit,
                confidence=confidence,
                runner=run.runner_noise.get(name),
                later=later,
            )
            judged = judge(hearing)
            judgements.append(_few_sessions(judged, baseline, stored, len(counts)))
    named = reference_name(baseline, run) if baseline is not None else ""
    return tuple(dataclasses.replace(j, environment=allowed, reference=named) for j in judgements)


def _few_sessions(judged: Judgement, baseline: Baseline, stored: StoredMetric, sessions: int) -> Judgement:
    """Against a history too short to show how far this runner's sessions differ, a change beyond
    the tolerance is not confirmed: the repeats of one session cannot show it (two back-to-back
    sessions of one vLLM here differed by 25 %, which their repeats called significant). The
    history's runs and the run's ``sessions`` count together, as the verdict's interval counts them
    (:func:`~pytest_qwenperf.core.verdict.sessions_known`): ``MIN_SESSIONS`` runs against a run of
    one session, fewer against a run that pooled several. A regression is ``noisy``, an improvement
    ``underpowered``: said, never failed on. (A stored baseline was chosen by someone; a history
    reference is whatever ran last.) Neither, nor a change beyond the tolerance that its repeats
    could not confirm yet, settles with more repeats of this run: more runs in the history settle it."""
    runs = len(stored.sessions or (1,))
    if not isinstance(baseline, PooledBaseline) or sessions_known(runs, sessions):
        return judged
    if judged.verdict in UNDECIDED and _beyond_tolerance(judged):
        return dataclasses.replace(judged, settles_with_repeats=False)
    if judged.verdict not in ("regression", "improvement"):
        return judged
    side = "worse" if judged.verdict == "regression" else "better"
    needed = MIN_SESSIONS + 1 - sessions  # the fewest runs sessions_known takes with the run's sessions
    alongside = "" if sessions == 1 else f" alongside this run's {sessions} sessions"
    detail = (
        f"{side} than the tolerance, but the history holds {runs} run(s) of {needed} needed{alongside} "
        f"to know how far this runner's sessions differ, so it is not confirmed: {judged.detail.split(': ', 1)[-1]}"
    )
    demoted: Verdict = "noisy" if judged.verdict == "regression" else "underpowered"
    return dataclasses.replace(judged, verdict=demoted, detail=detail, settles_with_repeats=False)


def _beyond_tolerance(judged: Judgement) -> bool:
    """Whether the judgement's point estimate lies beyond its tolerance, on either side."""
    if judged.ratio is None or judged.ratio <= 0:
        return False
    change = abs(math.log(judged.ratio))
    return change > (-math.log1p(-judged.tolerance) if judged.direction == "higher" else math.log1p(judged.tolerance))


REFERENCE_RUN = "reference run"
"""What a run judged against another run (``qwenperf compare``, a candidate's session) names as its reference."""


def reference_name(baseline: Baseline, run: Run | None = None) -> str:
    """What a verdict against ``baseline`` names as its reference; a stored baseline that is stale
    for ``run`` (:func:`staleness`) says so."""
    if isinstance(baseline, PooledBaseline):
        return baseline.name
    source = baseline.provenance.source
    if source == REFERENCE_RUN:
        return REFERENCE_RUN
    if baseline.provenance.kind == "published":
        return f"published baseline ({source})"
    stale = staleness(baseline, run) if run is not None else None
    return f"stored baseline (stale: {stale})" if stale else "stored baseline"


def staleness(baseline: Baseline, run: Run) -> str | None:
    """Why a measured baseline is stale for ``run``: older than the run's suite allows
    (``baseline_max_age_days``), or recorded with another vLLM release line (0.31 against 0.32);
    None when neither holds or either side did not record it."""
    found = []
    recorded, measured = day_of(baseline.context.date), day_of(run.context.started)
    limit = run.baseline_max_age_days
    if recorded and measured and limit is not None and (measured - recorded).days > limit:
        found.append(f"recorded {recorded.isoformat()}, {(measured - recorded).days} days before this run (the suite allows {limit})")
    then, now = _release(baseline.context.vllm_version), _release(run.context.vllm_version)
    if then and now and then != now:
        found.append(f"recorded with vLLM {then}, this run has {now}")
    return "; ".join(found) or None


def day_of(text: str | None) -> datetime.date | None:
    """The day of an ISO 8601 date or timestamp (``2026-11-26T02:00:00+00:00``); None if absent or not one."""
    try:
        return datetime.date.fromisoformat(text[:10]) if text else None
    except ValueError:
        return None


def _release(version: str | None) -> str | None:
    """A vLLM version's release line: ``0.32`` of ``0.32.1`` or ``0.32.0+cpu``; None if unknown."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{found[1]}.{found[2]}" if found else None


def references(judgements: Sequence[Judgement]) -> tuple[str, ...]:
    """The references the judgements name, once each."""
    return tuple(dict.fromkeys(j.reference for j in judgements if j.reference))


def environment_notes(judgements: Sequence[Judgement]) -> tuple[str, ...]:
    """The allowed environment differences the judgements carry, once each."""
    return tuple(dict.fromkeys(d for j in judgements for d in j.environment))


def environment_differences(reference: Environment | None, run: Run) -> dict[str, str]:
    """Every field in which ``run``'s environment differs from ``reference`` (``reference`` first),
    worded; none where either was not recorded."""
    mine = run.context.environment
    return {} if reference is None or mine is None else reference.differences(mine)


def judge_against_run(
    reference: Run, run: Run, *, confidence: float = DEFAULT_CONFIDENCE, later: Later | None = None
) -> tuple[Judgement, ...]:
    """``run`` against another run as its baseline (``qwenperf compare``).

    As :func:`judge_run`, and the reference's own losses count too: a reference that lost
    data makes every comparison with it ``invalid`` (the reason says "(reference)"), and
    so does a metric the run has and the reference names without a value. A metric the
    reference does not name at all stays ``no-baseline``. The sessions either run pooled count on
    their side (:func:`~pytest_qwenperf.core.verdict.judge`); where the two runs' histories both
    say how far their runner's sessions differ, the wider spread is taken.
    """
    baseline = baseline_from_run(reference, source=REFERENCE_RUN) if reference.gated_samples() else None
    judgements = judge_run(
        baseline, msgspec.structs.replace(run, runner_noise=_wider(reference, run)), confidence=confidence, later=later
    )
    found = losses(reference, "reference")
    reference_lost = reference.lost_values()
    comparable = reference.identity.baseline() == run.identity.baseline()
    judged = []
    for j in judgements:
        own = [Loss(reason=j.reason, detail=j.detail)] if j.verdict == "invalid" else []
        if j.verdict == "no-baseline" and j.metric in reference_lost and comparable:
            lost = Loss(reason=f"{NO_VALUE} (reference)", detail=f"the reference has no value for it ({reference_lost[j.metric]}); the run has one")
            judged.append(_invalid(j, [*found, lost]))
        elif found and j.verdict != "no-baseline":
            judged.append(_invalid(j, [*own, *found]))
        else:
            judged.append(j)
    return tuple(judged)


def _wider(reference: Run, run: Run) -> dict[str, SessionSpread]:
    """Per metric, the wider of the two runs' :attr:`~pytest_qwenperf.core.run.Run.runner_noise`."""
    names = reference.runner_noise.keys() | run.runner_noise.keys()
    return {name: max((s for s in (reference.runner_noise.get(name), run.runner_noise.get(name)) if s), key=lambda s: s.log_sd) for name in names}


def render_judgements(judgements: Sequence[Judgement], *, markdown: bool = False) -> str:
    """The table of :attr:`Judgement.HEADER`, then the detail of every verdict that is not a pass,
    then how the environment differs where the suite allows it."""
    lines = [f"vs {name}" for name in references(judgements)]
    lines += format_table(Judgement.HEADER, [j.row() for j in judgements], markdown=markdown)
    notes = [f"{j.metric}: {j.label}: {j.detail}" for j in judgements if j.verdict != "pass"]
    notes += [f"environment differs (allowed): {d}" for d in environment_notes(judgements)]
    if notes:
        lines.append("")
        lines += [f"- {note}" for note in notes] if markdown else notes
    return "\n".join(lines)

