"""``qwenperf lint``: suite files and their flags against the installed vLLM's own parser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_qwenperf.suite.config import SuiteError, load_suite
from pytest_qwenperf.suite.vllm_args import ParserUnavailable, check_configs

HELP = "check suite files and their flags against the installed vLLM's own parser"
DESCRIPTION = (
    "Exit 1 if any suite file is malformed or any config has a flag vLLM would reject; "
    "exit 2 if the check cannot run (--python is no Python with vLLM)."
)
ERRORS: tuple[type[Exception], ...] = (SuiteError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suites", nargs="+", type=Path, metavar="SUITE")
    parser.add_argument("--python", default=sys.executable, help="Python whose vLLM to check against (default: this one)")


def run(args: argparse.Namespace) -> int:
    """Exit 1 when a suite or a flag fails the check, 2 when the check cannot run (``--python`` without vLLM).
    One child Python answers for every suite's configs."""
    failures = 0
    loaded = {}
    for path in args.suites:
        try:
            loaded[str(path)] = load_suite(path).configs
        except SuiteError as exc:
            print(f"FAIL {exc}")
            failures += 1
    try:
        checks = check_configs(loaded, python=args.python) if loaded else []
    except ParserUnavailable as exc:
        print(f"qwenperf lint: --python {exc}", file=sys.stderr)
        return 2
    for check in checks:
        if check.ok:
            print(f"ok   {check.suite}: {check.config_id} (vLLM {check.vllm_version})")
        else:
            print(f"FAIL {check.error}")
            failures += 1
    return 1 if failures else 0
