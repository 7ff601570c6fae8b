"""A point measured until its verdicts decide: extra repeats while the data cannot, up to a plan's most.

A point is measured with the plan's first repeats and judged against its baseline. While
a gated verdict is one more repeats can settle (:data:`~pytest_qwenperf.core.verdict.UNDECIDED`)
and the plan allows another, one more repeat is measured, the repeats are combined into
the run again, and the run is judged again. Each look is judged at the confidence the
plan gives it (:meth:`~pytest_qwenperf.core.sequential.SequentialPlan.confidence_at`), so
looking again does not raise the false-alarm rate.

A run that lost data, or has nothing comparable to be judged against, takes no extra
repeat: more of the same cannot turn it into a verdict. Nor does a run whose undecided verdicts
only other sessions can settle (:func:`settleable`): where the reference's sessions differ by more
than the tolerance allows to see, or a history of too few runs cannot confirm a change, the
repeats of this session, however many, leave the verdict where it is.

A point can also be measured on two servers at once, a reference and a candidate
(:func:`measure_interleaved`): their repeats alternate, so what drifts during the session
(the machine's other load, its clock, its caches) falls on both sides instead of adding to
their difference, and the candidate is judged against the reference's run, both growing by
one repeat per look.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TypeVar

import msgspec

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.verdict import DECIDED, UNDECIDED, Judgement
from pytest_qwenperf.gate.baseline import Baseline, BaselineError, evidence
from pytest_qwenperf.gate.diagnosis import Diagnosis, Evidence, diagnose
from pytest_qwenperf.gate.judge import judge_against_run, judge_run
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.progress import PointProgress, told
from pytest_qwenperf.measure.run import Repeat, chained, combine_repeats, measure_repeat, profiled
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.serving.sleep import Turns
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload

R = TypeVar("R")


@dataclass(frozen=True)
class Decided:
    """A point's run (``extra_repeats`` says how many repeats the plan added) and the verdicts
    of its last look, judged at that look's confidence."""

    run: Run
    judgements: tuple[Judgement, ...]
    unreadable: str | None = None  # why the run's baseline could not be read (then judged without one)
    diagnosis: Diagnosis | None = None  # why it regressed, from what its baseline kept; None: no regression, or no baseline


def undecided(judgements: Sequence[Judgement]) -> bool:
    """Whether another repeat could settle a verdict: one is undecided, and none lost data."""
    return any(j.verdict in UNDECIDED for j in judgements) and not any(j.verdict == "invalid" for j in judgements)


def settleable(judgements: Sequence[Judgement]) -> bool:
    """Whether another repeat could settle one of the undecided ``judgements``: one is undecided and
    not for want of sessions (:attr:`~pytest_qwenperf.core.verdict.Judgement.settles_with_repeats`:
    the reference's sessions differ by more than the change or the tolerance, or a history too short
    to confirm any change), where an extra repeat would be spent for nothing."""
    return any(j.verdict in UNDECIDED and j.settles_with_repeats for j in judgements)


def clearly_decided(judgements: Sequence[Judgement]) -> bool:
    """Whether every verdict is decided (pass, regression or improvement): an early look may stop here."""
    return bool(judgements) and all(j.verdict in DECIDED for j in judgements)


def decide(
    plan: SequentialPlan,
    repeat: Callable[[], R],
    combine: Callable[[Sequence[R]], Run],
    baseline_of: Callable[[Run], Baseline | None],
) -> Decided:
    """Measure ``plan.first`` repeats, then one more at a time while the verdicts are
    :func:`undecided` and the plan allows it. With early looks (``plan.least``) the point is judged
    from ``plan.least`` repeats on, and stops before ``plan.first`` once :func:`clearly_decided`.

    ``repeat`` measures one repeat, ``combine`` makes the run of the repeats so far, and
    ``baseline_of`` finds the run's baseline (asked once: every repeat has the run's identity).
    A baseline that cannot be read (:class:`BaselineError`) is no baseline for the verdicts, and
    the result says why, for the test that needs it to fail with.
    """
    repeats = [repeat() for _ in range(plan.earliest)]
    run = combine(repeats)
    unreadable = None
    try:
        baseline = baseline_of(run)
    except BaselineError as exc:
        baseline, unreadable = None, str(exc)

    def look() -> tuple[Judgement, ...]:
        return judge_run(baseline, run, confidence=plan.confidence_at(len(repeats)), later=plan.later(len(repeats)))

    judgements = look()
    while plan.early(len(repeats)) and not clearly_decided(judgements):
        repeats.append(repeat())
        run = combine(repeats)
        judgements = look()

    while undecided(judgements) and settleable(judgements) and len(repeats) < plan.most:
        repeats.append(repeat())
        run = combine(repeats)
        judgements = look()
    diagnosis = why(evidence(baseline), run, judgements) if baseline is not None else None
    run = msgspec.structs.replace(
        run,
        extra_repeats=max(0, len(repeats) - plan.first),
        saved_repeats=max(0, plan.first - len(repeats)),
        needs_sessions=_needs_sessions(plan, repeats, judgements),
    )
    return Decided(run, judgements, unreadable, diagnosis)


def _needs_sessions(plan: SequentialPlan, repeats: Sequence[object], judgements: Sequence[Judgement]) -> bool:
    """Whether the run stopped undecided before the plan's most: only other sessions can settle it."""
    return undecided(judgements) and len(repeats) < plan.most


def why(reference: Run | Evidence, run: Run, judgements: Sequence[Judgement]) -> Diagnosis | None:
    """The likely causes of a regression among ``judgements`` (:func:`~pytest_qwenperf.gate.diagnosis.diagnose`); None without one."""
    found = diagnose(reference, run, judgements)
    return found if found.changed else None


@dataclass(frozen=True)
class DecidedPair:
    """A point measured on two servers, repeats interleaved: the candidate's run, the reference's
    run (each with the ``extra_repeats`` the plan added), and the candidate's verdicts against the
    reference at the last look."""

    run: Run
    reference: Run
    judgements: tuple[Judgement, ...]
    diagnosis: Diagnosis | None = None  # why the candidate regressed against the reference; None: it did not


def decide_interleaved(
    plan: SequentialPlan,
    repeat_reference: Callable[[], R],
    repeat_candidate: Callable[[], R],
    combine: Callable[[Sequence[R]], Run],
) -> DecidedPair:
    """As :func:`decide`, with a repeat of each side per look, in the order reference, candidate,
    candidate, reference, reference, ... (A B B A): a drift linear in time weighs on both sides
    alike over every two pairs, and neither side is always the one measured right after the other."""
    references: list[R] = []
    candidates: list[R] = []

    def pair() -> None:
        sides = ((references, repeat_reference), (candidates, repeat_candidate))
        for repeats, repeat in sides if len(references) % 2 == 0 else sides[::-1]:
            repeats.append(repeat())

    def look() -> tuple[Run, Run, tuple[Judgement, ...]]:
        reference, run = combine(references), combine(candidates)
        n = len(candidates)
        return reference, run, judge_against_run(reference, run, confidence=plan.confidence_at(n), later=plan.later(n, both=True))

    for _ in range(plan.first):
        pair()
    reference, run, judgements = look()
    while undecided(judgements) and settleable(judgements) and len(candidates) < plan.most:
        pair()
        reference, run, judgements = look()
    extra = len(candidates) - plan.first
    needs = _needs_sessions(plan, candidates, judgements)
    return DecidedPair(
        msgspec.structs.replace(run, extra_repeats=extra, needs_sessions=needs),
        msgspec.structs.replace(reference, extra_repeats=extra, needs_sessions=needs),
        judgements,
        why(reference, run, judgements),
    )


def measure_point(
    server: Server,
    config: ServingConfig,
    workload: SuiteWorkload,
    method: Method,
    baseline_of: Callable[[Run], Baseline | None],
    progress: PointProgress | None = None,
) -> Decided:
    """:func:`~pytest_qwenperf.measure.run.measure` with as many repeats as :func:`decide` takes on the method's plan;
    ``progress`` is told of each repeat, its load runs and their requests. Its operator profile, where the
    method asks for one, comes after them all (:func:`~pytest_qwenperf.measure.run.profiled`)."""

    repeat = chained(lambda after: measure_repeat(server, config, workload, method, progress, after))

    def combine(repeats: Sequence[Repeat]) -> Run:
        return combine_repeats(repeats, config.replicas, method)

    started = time.monotonic()
    decided = decide(method.plan, told(repeat, method.plan, progress), combine, baseline_of)
    run = msgspec.structs.replace(decided.run, elapsed_s=time.monotonic() - started)
    return replace(decided, run=profiled(run, server, config, workload, method))


def measure_interleaved(
    reference: Server,
    candidate: Server,
    config: ServingConfig,
    workload: SuiteWorkload,
    method: Method,
    progress: PointProgress | None = None,
    turns: Turns | None = None,
) -> DecidedPair:
    """The point on both servers, as many repeats each as :func:`decide_interleaved` takes on the method's plan;
    then, where the method asks, each side's operator profile (the reference's first), in folders of their own.
    ``turns``: the servers take turns on the GPUs (:mod:`~pytest_qwenperf.serving.sleep`), the one measured
    awake, the other asleep; None: both stay awake."""

    def awake(server: Server) -> Server:
        if turns is not None:
            turns.take(server)
        return server

    def repeat_on(server: Server, side: str) -> Callable[[], Repeat]:
        repeat = chained(lambda after: measure_repeat(awake(server), config, workload, method, progress, after))
        return told(repeat, method.plan, progress, side)

    def combine(repeats: Sequence[Repeat]) -> Run:
        return combine_repeats(repeats, config.replicas, method)

    started = time.monotonic()
    pair = decide_interleaved(method.plan, repeat_on(reference, "reference"), repeat_on(candidate, "candidate"), combine)
    elapsed = time.monotonic() - started  # both sides': what the point cost
    pair = replace(
        pair,
        run=msgspec.structs.replace(pair.run, elapsed_s=elapsed),
        reference=msgspec.structs.replace(pair.reference, elapsed_s=elapsed),
    )
    if method.profile is None:
        return pair
    base = profiled(pair.reference, awake(reference), config, workload, _side(method, "reference"))
    return replace(pair, reference=base, run=profiled(pair.run, awake(candidate), config, workload, _side(method, "candidate")))


def _side(method: Method, side: str) -> Method:
    """``method`` with one side's operator profiles in a subfolder of their own."""
    return replace(method, profile=method.profile.under(side)) if method.profile else method


ServerOf = Callable[[], AbstractContextManager[Server]]
"""A running server for as long as the block runs (the caller decides whether it stops after)."""


def measure_pair(
    reference: ServerOf,
    candidate: ServerOf,
    config: ServingConfig,
    workload: SuiteWorkload,
    method: Method,
    *,
    side_by_side: bool,
    progress: PointProgress | None = None,
    turns: Turns | None = None,
) -> DecidedPair:
    """The point on a reference's server and a candidate's, the candidate judged against the
    reference's run: the one way the plugin (``--qwenperf-candidate``) and ``qwenperf bisect``
    pit two vLLMs against each other.

    Side by side (both servers up at once), repeats interleaved as :func:`measure_interleaved` does: both
    awake on the CPU build, taking ``turns`` through sleep mode on one GPU node. Otherwise (a GPU node holds one server at a time) each is
    measured alone with the plan's first repeats, the reference first, inside its own block so
    that its server can stop before the candidate's boots; the verdicts are at the confidence of
    the plan's first look. ``progress`` is told of the repeats of both, as :func:`measure_point` tells it."""
    if side_by_side:
        with reference() as ref, candidate() as cand:
            return measure_interleaved(ref, cand, config, workload, method, progress, turns)
    with reference() as server:
        base = measure_point(server, config, workload, _side(method, "reference"), lambda run: None, progress).run
    with candidate() as server:
        run = measure_point(server, config, workload, _side(method, "candidate"), lambda run: None, progress).run
    judgements = judge_against_run(base, run, confidence=method.plan.confidence_at(method.plan.first))
    return DecidedPair(run, base, judgements, why(base, run, judgements))
