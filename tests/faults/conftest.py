"""The fault cases of the reliability issue: bad inputs, lost data, signals, leftovers.

Every test under this folder is one case a new user could hit. The session closes with
a line counting the cases tried and how many held, so a CI log says at a glance how much
of the fault catalogue ran.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

_HERE = Path(__file__).parent


class _Tally:
    """Outcome per case: its call, or the setup that stopped it (a failed or skipped fixture)."""

    def __init__(self, rootpath: Path) -> None:
        self.rootpath = rootpath
        self.outcomes: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (self.rootpath / report.nodeid.partition("::")[0]).resolve().is_relative_to(_HERE):
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[report.outcome] += 1

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tried = sum(self.outcomes.values())
        if not tried:
            return
        line = f"fault cases: {tried} tried, {self.outcomes['passed']} held, {self.outcomes['failed']} failed"
        if self.outcomes["skipped"]:
            line += f", {self.outcomes['skipped']} skipped"
        terminalreporter.write_sep("=", line, green=not self.outcomes["failed"], red=bool(self.outcomes["failed"]))


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("qwenperf-fault-tally"):
        config.pluginmanager.register(_Tally(config.rootpath), "qwenperf-fault-tally")
