"""A point measured until its verdicts decide: extra repeats while the data cannot, up to a plan's most.

A point is measured with the plan's first repeats and judged against its baseline. While
a gated verdict is one more repeats can settle (:data:`~pytest_qwenperf.core.verdict.UNDECIDED`)
and the plan allows another, one more repeat is measured, the repeats are combined into
the run again, and the run is judged again. Each look is judged at the confidence the
plan gives it (:meth:`~pytest_qwenperf.core.sequential.SequentialPlan.confidence_at`), so
looking again does not raise the false-alarm rate.

A run that lost data, or has nothing comparable to be judged against, takes no extra
repeat: more of the same cannot turn it into a verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import msgspec

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.verdict import UNDECIDED, Judgement
from pytest_qwenperf.gate.baseline import Baseline
from pytest_qwenperf.gate.judge import judge_run
from pytest_qwenperf.measure.run import Repeat, combine_repeats, measure_repeat
from pytest_qwenperf.measure.scaling import Route
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload

R = TypeVar("R")


@dataclass(frozen=True)
class Decided:
    """A point's run (``extra_repeats`` says how many repeats the plan added) and the verdicts
    of its last look, judged at that look's confidence."""

    run: Run
    judgements: tuple[Judgement, ...]


def undecided(judgements: Sequence[Judgement]) -> bool:
    """Whether another repeat could settle a verdict: one is undecided, and none lost data."""
    return any(j.verdict in UNDECIDED for j in judgements) and not any(j.verdict == "invalid" for j in judgements)


def decide(
    plan: SequentialPlan,
    repeat: Callable[[], R],
    combine: Callable[[Sequence[R]], Run],
    baseline_of: Callable[[Run], Baseline | None],
) -> Decided:
    """Measure ``plan.first`` repeats, then one more at a time while the verdicts are
    :func:`undecided` and the plan allows it.

    ``repeat`` measures one repeat, ``combine`` makes the run of the repeats so far, and
    ``baseline_of`` finds the run's baseline (asked once: every repeat has the run's identity).
    """
    repeats = [repeat() for _ in range(plan.first)]
    run = combine(repeats)
    baseline = baseline_of(run)
    judgements = judge_run(baseline, run, confidence=plan.confidence_at(len(repeats)))
    while undecided(judgements) and len(repeats) < plan.most:
        repeats.append(repeat())
        run = combine(repeats)
        judgements = judge_run(baseline, run, confidence=plan.confidence_at(len(repeats)))
    return Decided(msgspec.structs.replace(run, extra_repeats=len(repeats) - plan.first), judgements)


def measure_point(
    server: Server,
    config: ServingConfig,
    workload: SuiteWorkload,
    plan: SequentialPlan,
    baseline_of: Callable[[Run], Baseline | None],
    *,
    suite: str = "",
    client_cpus: frozenset[int] = frozenset(),
    tolerances: Mapping[str, float] = MappingProxyType({}),
    routes: Sequence[Route] | None = None,
    workers: int = 1,
    api_key: ApiKey | None = None,
) -> Decided:
    """:func:`~pytest_qwenperf.measure.run.measure` with as many repeats as :func:`decide` takes."""

    def repeat() -> Repeat:
        return measure_repeat(server, config, workload, suite=suite, client_cpus=client_cpus, routes=routes, workers=workers, api_key=api_key)

    def combine(repeats: Sequence[Repeat]) -> Run:
        return combine_repeats(repeats, config.replicas, tolerances=tolerances)

    return decide(plan, repeat, combine, baseline_of)
