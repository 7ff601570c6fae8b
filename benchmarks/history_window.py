"""How many past runs the history reference should pool (``[suite] history_window``), on the
noise of real nights.

It reads the valid runs of one point from a history store of nights without a step (real
sessions, each with its repeats), and for each window ``k`` draws many histories: ``k`` nights
at random (without replacement) as the reference, pooled as the plugin pools them (each run a
session: :class:`~pytest_qwenperf.history.reference.HistoryReference`), and one more night as the
run, its repeats made worse by a step. Each draw is judged by the plugin's own rule
(:func:`~pytest_qwenperf.gate.judge.judge_run`) at the given tolerance. Per window and step it
reports the share judged ``regression`` (false alarms at step 0, detections above), the share
``underpowered`` or ``noisy`` (said, not failed), and the median MDE. ``--repeats-only`` judges
the same draws as if the reference were one session's repeats (the rule before the spread between
sessions counted), for comparison. The pooled reference is judged as a stored baseline would be
(a history of fewer than 3 runs would be ``noisy`` at most: :func:`~pytest_qwenperf.gate.judge.judge_run`).

    python -m benchmarks.history_window benchmarks/results/history-2026-11-24/flat.sqlite \
        --windows 3,5,7,10 --steps 0,0.10,0.15,0.20 --tolerance 0.10 --trials 400

What it rests on: nights drawn independently from one machine's real nights, so drift between
nights close in time is not in it, and the step is a uniform slowdown of every repeat.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import Counter

import msgspec

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.gate.judge import judge_run
from pytest_qwenperf.history.reference import HistoryReference, comparable_runs

METRIC = "output_throughput"


def slowed(run: Run, step: float, tolerance: float) -> Run:
    """``run`` with every repeat of :data:`METRIC` ``step`` worse, judged at ``tolerance``."""
    samples = dict(run.samples or {})
    samples[METRIC] = tuple(None if v is None else v * (1 - step) for v in samples[METRIC])
    return msgspec.structs.replace(run, samples=samples, tolerances={**(run.tolerances or {}), METRIC: tolerance})


def trial(rng: random.Random, nights: list[Run], window: int, step: float, args: argparse.Namespace) -> tuple[str, float | None]:
    tolerance = args.tolerance
    drawn = rng.sample(nights, window + 1)
    history = [msgspec.structs.replace(r, tolerances={**(r.tolerances or {}), METRIC: tolerance}) for r in drawn[:window]]
    pooled = HistoryReference(tuple(history), after_change=False).pooled("benchmark")
    if args.repeats_only:  # the rule before sessions counted: every repeat one sample of one session
        pooled = msgspec.structs.replace(
            pooled, metrics={n: msgspec.structs.replace(m, sessions=None) for n, m in pooled.metrics.items()}
        )
    baseline = pooled
    (judged,) = [j for j in judge_run(baseline, slowed(drawn[window], step, tolerance)) if j.metric == METRIC]
    return judged.verdict, judged.mde


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="a history store of nights without a step")
    parser.add_argument("--windows", default="3,5,7,10")
    parser.add_argument("--steps", default="0,0.10,0.15,0.20")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats-only", action="store_true", help="judge as if the reference were one session's repeats")
    args = parser.parse_args(argv)
    with HistoryStore.open(args.store, create=False) as store:
        (key,) = store.keys(metric=METRIC)
        latest = store.latest_valid_run(key)
        assert latest is not None
        nights = comparable_runs(store, latest)
    rng = random.Random(args.seed)
    rows = []
    for window in (int(w) for w in args.windows.split(",")):
        if window + 1 > len(nights):
            raise SystemExit(f"a window of {window} needs {window + 1} nights; the store has {len(nights)}")
        for step in (float(s) for s in args.steps.split(",")):
            outcomes = [trial(rng, nights, window, step, args) for _ in range(args.trials)]
            verdicts = Counter(v for v, _ in outcomes)
            mdes = [m for _, m in outcomes if m is not None]
            rows.append({
                "window": window, "step": step,
                "regression": verdicts["regression"] / args.trials,
                "undecided": (verdicts["underpowered"] + verdicts["noisy"]) / args.trials,
                "pass": verdicts["pass"] / args.trials,
                "verdicts": dict(verdicts),
                "median_mde": statistics.median(mdes) if mdes else None,
            })  # fmt: skip
    centres = [statistics.fmean(r.gated_samples()[METRIC]) for r in nights]
    print(json.dumps({
        "store": args.store, "series": str(key), "nights": len(nights),
        "night_cv": statistics.stdev(centres) / statistics.fmean(centres),
        "tolerance": args.tolerance, "trials": args.trials, "seed": args.seed, "repeats_only": args.repeats_only, "rows": rows,
    }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
