"""Early looks: how often does a point stop before its planned repeats, and do false alarms stay put?

A simulation of the gate's own rule (:func:`~pytest_qwenperf.core.verdict.judge`) over a plan's
looks, as :func:`~pytest_qwenperf.measure.sequential.decide` takes them: early looks from
``--least`` repeats (a stop once every verdict is decided), the planned look at ``--first``, extra
looks while a verdict is undecided up to ``--most``. A point is one metric here, throughput (higher
is better), with ``--baseline`` repeats on the baseline's side; every repeat's value is lognormal
with the spread ``--spread`` (its coefficient of variation), the run's moved by ``--change``.

Per change it prints the share of draws judged ``regression`` (at a change of 0: the false alarms,
whose nominal rate is ``(1 - confidence) / 2``, 2.5 %), ``improvement``, undecided, the share
stopped early and the mean repeats taken, for the plan with its early looks and for the same plan
without them, on the same draws (one seed).

    .venv/bin/python -m benchmarks.early_stop --least 3 --first 4 --most 6 --baseline 4 --spread 0.015 \\
        --tolerance 0.05 --changes 0,-0.03,-0.05,-0.10 --draws 4000
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.verdict import DECIDED, DEFAULT_CONFIDENCE, UNDECIDED, Hearing, Judgement, Side, Verdict, judge


@dataclass(frozen=True)
class Case:
    """What is drawn: the plan, the baseline's repeats, the spread and the tolerance."""

    plan: SequentialPlan
    baseline: int
    spread: float
    tolerance: float


@dataclass(frozen=True)
class Outcome:
    """Draws by final verdict, how many stopped early, and the repeats taken in all."""

    verdicts: Counter[Verdict]
    early: int
    repeats: int
    draws: int

    def share(self, verdict: Verdict) -> float:
        return self.verdicts[verdict] / self.draws


def follow(plan: SequentialPlan, judged: Callable[[int, float], Judgement]) -> tuple[Judgement, int]:
    """The last verdict and the repeats it took, looks taken as ``measure.sequential.decide`` takes
    them: ``judged(n, confidence)`` judges the first ``n`` repeats at that look's confidence; an early
    look stops once decided, the planned and extra looks once not undecided, or at the most."""
    n = plan.earliest
    while True:
        judgement = judged(n, plan.confidence_at(n))
        if plan.early(n):
            if judgement.verdict in DECIDED:
                return judgement, n
        elif judgement.verdict not in UNDECIDED or n == plan.most:
            return judgement, n
        n += 1


def _follow(case: Case, baseline: list[float], current: list[float]) -> tuple[Verdict, int]:
    """The final verdict of one draw and the repeats it took."""

    def judged(n: int, confidence: float) -> Judgement:
        sides = Side(tuple(baseline)), Side(tuple(current[:n]))
        return judge(Hearing("output_throughput", *sides, direction="higher", tolerance=case.tolerance, confidence=confidence))

    judgement, taken = follow(case.plan, judged)
    return judgement.verdict, taken


def simulate(case: Case, change: float, draws: int, seed: int) -> Outcome:
    """``draws`` points whose run is moved by ``change`` (a fraction: -0.05 is 5 % slower)."""
    rng = np.random.default_rng(seed)
    sigma = float(np.log1p(case.spread))
    verdicts: Counter[Verdict] = Counter()
    early = repeats = 0
    for _ in range(draws):
        baseline = list(np.exp(rng.normal(0.0, sigma, case.baseline)))
        current = list(np.exp(rng.normal(np.log1p(change), sigma, case.plan.most)))
        verdict, taken = _follow(case, baseline, current)
        verdicts[verdict] += 1
        early += taken < case.plan.first
        repeats += taken
    return Outcome(verdicts, early, repeats, draws)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--least", type=int, default=3, help="the earliest look (default %(default)s)")
    parser.add_argument("--first", type=int, default=4, help="the planned repeats (default %(default)s)")
    parser.add_argument("--most", type=int, default=6, help="the most repeats (default %(default)s)")
    parser.add_argument("--baseline", type=int, default=4, help="the baseline's repeats (default %(default)s)")
    parser.add_argument("--spread", type=float, default=0.015, help="a repeat's coefficient of variation (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="the gate's tolerance (default %(default)s)")
    parser.add_argument("--changes", default="0,-0.03,-0.05,-0.10", help="the run's changes, comma-separated fractions")
    parser.add_argument("--draws", type=int, default=4000, help="draws per change (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of every change's draws (default %(default)s)")
    args = parser.parse_args(argv)
    plans = {
        "early looks": SequentialPlan(DEFAULT_CONFIDENCE, args.first, args.most, args.least),
        "none": SequentialPlan(DEFAULT_CONFIDENCE, args.first, args.most),
    }
    print(
        f"{args.draws} draws a change; baseline {args.baseline} repeats, spread {args.spread:.1%}, tolerance {args.tolerance:.0%}, "
        f"looks from {args.least} (early), {args.first} (planned) to {args.most}"
    )
    print(f"{'change':>7} {'plan':<12} {'regression':>10} {'improvement':>11} {'undecided':>9} {'early':>6} {'repeats':>7}")
    for change in (float(c) for c in args.changes.split(",")):
        for name, plan in plans.items():
            outcome = simulate(Case(plan, args.baseline, args.spread, args.tolerance), change, args.draws, args.seed)
            undecided = sum(outcome.share(v) for v in UNDECIDED)
            print(
                f"{change:>7.0%} {name:<12} {outcome.share('regression'):>10.2%} {outcome.share('improvement'):>11.2%} "
                f"{undecided:>9.2%} {outcome.early / outcome.draws:>6.1%} {outcome.repeats / outcome.draws:>7.2f}"
            )


if __name__ == "__main__":
    main()
