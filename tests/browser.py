"""Debian's Chromium, headless, as the report's tests drive it: the network cut off (every request
goes to a closed port), the page's scripts given virtual time to finish, and what it logged to its
console kept."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

OFFLINE = ("--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>")
VIRTUAL_TIME = "--virtual-time-budget=30000"


@dataclass(frozen=True)
class Browsed:
    dom: str  # the document after its scripts ran
    console: tuple[str, ...]  # every message the page logged (an error, a warning or a plain log)

    def charts(self) -> dict[str, str]:
        """Each chart element's ``data-drawn`` state, by its ``data-chart`` id."""
        found = {}
        for tag in re.findall(r"<div [^>]*data-chart=[^>]*>", self.dom):
            chart = re.search(r'data-chart="([^"]*)"', tag)
            drawn = re.search(r'data-drawn="([^"]*)"', tag)
            assert chart is not None
            found[chart.group(1)] = drawn.group(1) if drawn else ""
        return found

    def faults(self) -> list[str]:
        """What is wrong with a report's page as the browser drew it: any console message, a chart
        not drawn (or none at all), fewer SVG paths carrying data than charts."""
        found = ["the browser's console: " + "; ".join(self.console)] if self.console else []
        charts = self.charts()
        undrawn = sorted(chart for chart, drawn in charts.items() if drawn != "yes")
        if not charts or undrawn:
            found.append(f"charts not drawn: {undrawn or 'no chart at all'}")
        paths = len(re.findall(r'<path[^>]* d="M[^"]{20,}"', self.dom))
        if paths < len(charts):
            found.append(f"{paths} path(s) with data for {len(charts)} chart(s)")
        return found

    def verdict_table(self) -> str:
        """The report's verdict table, its markup from the table's attributes to its end ("": the page has none)."""
        _, found, rest = self.dom.partition('<table id="verdict-table"')
        return rest.split("</table>", 1)[0] if found else ""


def chromium() -> str:
    """The browser; the test skips where it is not installed, and fails instead in CI (``.ci/run``
    installs it), as the tests of nginx and PostgreSQL do: a skip there would hide that the report
    went undrawn."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "Debian's chromium is needed for the report's browser tests (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def browse(page: Path, *flags: str) -> Browsed:
    done = subprocess.run(
        [chromium(), *OFFLINE, VIRTUAL_TIME, "--enable-logging=stderr", "--v=0", *flags, "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180, check=True,
    )  # fmt: skip
    console = tuple(line for line in done.stderr.splitlines() if ":CONSOLE" in line)
    return Browsed(done.stdout, console)


def screenshot(page: Path, path: Path, height: int = 2400) -> Path:
    subprocess.run(
        [chromium(), *OFFLINE, VIRTUAL_TIME, "--hide-scrollbars", f"--window-size=1280,{height}", f"--screenshot={path}", page.as_uri()],
        capture_output=True, timeout=180, check=True,
    )  # fmt: skip
    return path


def print_pdf(page: Path, path: Path) -> bytes:
    subprocess.run(
        [chromium(), *OFFLINE, VIRTUAL_TIME, "--no-pdf-header-footer", f"--print-to-pdf={path}", page.as_uri()],
        capture_output=True, timeout=180, check=True,
    )  # fmt: skip
    return path.read_bytes()
