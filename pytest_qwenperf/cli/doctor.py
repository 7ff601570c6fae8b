"""``qwenperf doctor``: a pre-flight check of this machine for a suite (the checks: ``serving.doctor``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pytest_qwenperf.core.options import whole_number
from pytest_qwenperf.serving.doctor import DoctorOptions, run_doctor
from pytest_qwenperf.suite.config import SuiteError, load_suite

HELP = "check this machine before a suite runs on it: GPUs at rest and under a short load, CPUs, vLLM, the model"
DESCRIPTION = (
    "Each check says ok, warn or fail, the figure it read and what to do. "
    "Exit 1 if any check fails, else 0; exit 2 if the suite cannot be read."
)
ERRORS: tuple[type[Exception], ...] = (SuiteError,)
SUITES = Path("perf_tests/suites")
"""Where a suite named without a path is looked for."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", metavar="SUITE", help=f"a suite file, or the name of one in {SUITES} (e.g. h200)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    output.add_argument("--markdown", action="store_true", help="GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY)")
    parser.add_argument(
        "--load-seconds",
        type=whole_number(0),
        default=15,
        help="seconds of matrix products on every GPU (default %(default)s; 0: no load)",
    )


def run(args: argparse.Namespace) -> int:
    suite = load_suite(suite_path(args.suite)) if args.suite else None
    report = run_doctor(DoctorOptions(suite=suite, load_seconds=args.load_seconds))
    print(json.dumps(report.as_json(), indent=2) if args.json else report.markdown() if args.markdown else report.table())
    return report.exit_status


def suite_path(value: str) -> Path:
    """A path as given when it names a file or a ``.toml``; a bare name is a suite in :data:`SUITES`."""
    path = Path(value)
    return path if path.suffix == ".toml" or path.exists() or len(path.parts) > 1 else SUITES / f"{value}.toml"
