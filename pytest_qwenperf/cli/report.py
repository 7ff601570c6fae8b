"""``qwenperf report``: one self-contained HTML file of a session, or of sessions compared
against the first, that opens offline (:mod:`pytest_qwenperf.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_qwenperf.gate.compare import CompareError, load_runs
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore
from pytest_qwenperf.report.html import ReportUnavailable, write_report
from pytest_qwenperf.report.page import history_series

HELP = "write one offline HTML report of a session, or of sessions compared against the first"
DESCRIPTION = (
    "One HTML file with everything inlined (no server, no network): the verdict table (regressions and invalid runs "
    "first; sort and filter in the page), throughput per rung, the Pareto chart when capacity searches ran, each point's "
    "telemetry over time with its steady-state window, latency distributions, and the environment and configuration "
    "fields that differ. One SESSION: the verdicts it decided as it measured. Several: each judged against the first, "
    "as qwenperf compare judges them. Exit 2 for an unreadable input."
)
ERRORS: tuple[type[Exception], ...] = (CompareError, ReportUnavailable, HistoryError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sessions", nargs="+", type=Path, metavar="SESSION", help="a results file, or a directory of them (repeats)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="HTML", help="the report to write (an existing file is kept under a name of its own)")
    parser.add_argument("--title", default="", help="the report's title (default: the columns' labels)")
    parser.add_argument(
        "--history",
        metavar="STORE",
        help="draw each point's series from this history store (an SQLite file or a postgresql:// URL), with its change points",
    )


def run(args: argparse.Namespace) -> int:
    sets = [load_runs(path) for path in args.sessions]
    history = []
    if args.history:
        with HistoryStore.open(args.history, create=False) as store:
            history = history_series(store)
    kept = write_report(sets, args.output, args.title, history)
    note = f"; the previous file kept as {kept}" if kept else ""
    print(f"qwenperf: wrote {args.output} ({args.output.stat().st_size / 1e6:.2f} MB){note}", file=sys.stderr)
    return 0
