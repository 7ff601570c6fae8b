"""``qwenperf history``: the series of a history store with their change points; ``qwenperf history
import``: session JSON files and pytest-benchmark storage folders into a store."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_qwenperf.core.run import Run
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore
from pytest_qwenperf.gate.setups import SourceError
from pytest_qwenperf.gate.sources import read_results

HELP = "series of a history store and their change points; `history import` fills a store from result files"
DESCRIPTION = (
    "STORE is an SQLite file or a postgresql:// URL (--qwenperf-history, qwenperf bench --history). Each series is "
    "one metric of one config x workload on one machine, a point per run (the centre of its repeats); change points "
    "come from Apache Otava's E-divisive means with a t-test between the segments. --fail-on change exits 1 while a "
    "series' level is worse than its last good level by more than --min-change: the level before the earliest step for "
    "the worse (confirmed by at least two later runs) that it has not recovered from. "
    "`qwenperf history import STORE FILE...` records session JSON, pytest-benchmark JSON and folders of them "
    "(searched recursively, as pytest-benchmark's storage is laid out); a run already in the store is skipped."
)
ERRORS: tuple[type[Exception], ...] = (HistoryError, SourceError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", metavar="STORE", help="an SQLite file or a postgresql:// URL ('import' to fill one)")
    parser.add_argument("files", nargs="*", metavar="FILE", help="after 'import STORE': result files or folders")
    parser.add_argument("--config", help="only this config (its id, or suite/id)")
    parser.add_argument("--workload", help="only this workload")
    parser.add_argument("--metric", action="append", metavar="NAME", help="only these metrics (repeatable)")
    parser.add_argument("--fail-on", choices=("change",), help="exit 1 while a series' level is worse than its last good level (a confirmed step for the worse not recovered from)")
    parser.add_argument("--max-pvalue", type=float, help="keep changes whose t-test p-value is below this (default 0.001)")
    parser.add_argument("--min-change", type=float, help="keep changes of the level by at least this fraction (default 0.03)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY)")
    output.add_argument("--json", action="store_true", help="machine-readable output (schema qwenperf-history/1)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also draw the series with their change points (needs the plot extra)")


def run(args: argparse.Namespace) -> int:
    if args.store == "import":
        if not args.files:
            print("qwenperf: history import: expected STORE then at least one FILE or folder", file=sys.stderr)
            return 2
        return _import(args.files[0], [Path(f) for f in args.files[1:]])
    if args.files:
        print(f"qwenperf: history: unexpected arguments {args.files} (did you mean 'history import'?)", file=sys.stderr)
        return 2
    return _show(args)


def _import(store_at: str, paths: list[Path]) -> int:
    if not paths:
        print("qwenperf: history import: expected at least one FILE or folder after STORE", file=sys.stderr)
        return 2
    runs: list[Run] = []
    for path in paths:
        if not path.exists():
            raise SourceError(f"{path}: no such file or folder")
        runs += [result.run for result in read_results(path, recursive=True)]
    with HistoryStore.open(store_at) as store:
        added = store.append(runs, source="qwenperf history import")
    print(f"qwenperf: {added} run(s) recorded in {store.where}, {len(runs) - added} already there")
    return 0


def _show(args: argparse.Namespace) -> int:
    from pytest_qwenperf.history import report
    from pytest_qwenperf.history.changes import MAX_PVALUE, MIN_CHANGE

    with HistoryStore.open(args.store, create=False) as store:
        found = report.read_series(
            store,
            config=args.config,
            workload=args.workload,
            metrics=tuple(args.metric or ()),
            max_pvalue=MAX_PVALUE if args.max_pvalue is None else args.max_pvalue,
            min_change=MIN_CHANGE if args.min_change is None else args.min_change,
        )
    if not found:  # a filter's typo, or a store nothing was recorded in: nothing judged is no pass
        given = [("config", args.config), ("workload", args.workload), *(("metric", m) for m in args.metric or ())]
        filters = ", ".join(f"--{name} {value}" for name, value in given if value)
        print(f"qwenperf: history: no series in {store.where}" + (f" match {filters}" if filters else ": it holds no runs"), file=sys.stderr)
        return 2
    if args.plot:
        report.plot(found, args.plot)
    print(json.dumps(report.as_json(found), indent=2) if args.json else report.render(found, markdown=args.markdown))
    worse = [(s, s.decline) for s in found if s.decline is not None]
    if args.fail_on == "change" and worse:
        names = "; ".join(f"{s.key.config_key} / {s.key.workload} / {d.detail}" for s, d in worse)
        print(f"qwenperf: failing on a confirmed change for the worse: {names}", file=sys.stderr)
        return 1
    return 0
