"""How small a step ``qwenperf history --fail-on change`` finds, on the noise of real nights.

It reads one series of a history store of nights without a step (real sessions), and builds many
histories of ``--nights`` nights by drawing those nights' levels at random (with replacement).
From night ``k`` on (``k`` drawn from the middle third) each level is made worse by a step of the
given size; a step of 0 measures false alarms. Each history is judged with the same settings as
``qwenperf history`` (:func:`pytest_qwenperf.history.changes.change_points`, then
:func:`~pytest_qwenperf.history.changes.decline` with the smallest change kept as its tolerance).
Per step size it reports how often ``--fail-on change`` fails, and how often the step it fails on
is placed at ``k`` ± 1.

    python -m benchmarks.history_sensitivity benchmarks/results/history-2026-11-24/flat.sqlite \
        --metric output_throughput --nights 14 --trials 200 --steps 0,0.05,0.08,0.10,0.15,0.20

What it rests on: the drawn nights are independent, so slow drift or nights that run low together
(two did in the recorded history) are not in it; and a level is the mean of the night's repeats,
as ``qwenperf history`` takes it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys

from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.gate.history_store import HistoryStore, SeriesPoint
from pytest_qwenperf.history.changes import MIN_CHANGE, change_points, decline, levels


def trial(rng: random.Random, flat: list[float], nights: int, step: float, higher: bool) -> tuple[bool, bool]:
    """One drawn history with a step at ``k``: whether it fails, and whether it fails at ``k`` ± 1."""
    k = rng.randrange(nights // 3, 2 * nights // 3 + 1)
    factor = 1 - step if higher else 1 + step
    drawn = [rng.choice(flat) * (factor if i >= k else 1.0) for i in range(nights)]
    points = [SeriesPoint(f"r{i}", f"2026-11-{i + 1:02d}T02:00:00+00:00", "", "x", (v,)) for i, v in enumerate(drawn)]
    name = "output_throughput" if higher else "p99_tpot_ms"
    found = decline(points, change_points(points, name), name, MIN_CHANGE)
    return found is not None, found is not None and abs(found.step - 1 - k) <= 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="a history store of nights without a step")
    parser.add_argument("--metric", default="output_throughput")
    parser.add_argument("--nights", type=int, default=14)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--steps", default="0,0.05,0.08,0.10,0.15,0.20", help="step sizes, fractions of the level")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with HistoryStore.open(args.store, create=False) as store:
        (key,) = [k for k in store.keys(config=None, workload=None) if k.metric == args.metric]
        flat = levels([p for p in store.series(key) if p.values and not p.invalid])
    higher = metric(args.metric).direction == "higher"
    rng = random.Random(args.seed)
    rows = []
    for step in (float(s) for s in args.steps.split(",")):
        outcomes = [trial(rng, flat, args.nights, step, higher) for _ in range(args.trials)]
        rows.append({"step": step, "fails": sum(f for f, _ in outcomes) / args.trials, "at_k": sum(a for _, a in outcomes) / args.trials})
    spread = statistics.stdev(flat) / statistics.fmean(flat)
    print(json.dumps({"store": args.store, "series": str(key), "nights_drawn_from": len(flat), "level_cv": spread,
                      "nights": args.nights, "trials": args.trials, "seed": args.seed, "rows": rows}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
