"""The perf suite's own HTML report, checked in Chromium: CI runs this on the report of the CPU
suite it has just measured (``.ci/run``), so the page people open is the one tested, at its
real size, with every config and workload of the suite.

    python -m tests.report_check SESSION.json REPORT.html SCREENSHOT.png

Exits non-zero, saying what failed, unless: the file is under :data:`SIZE_LIMIT`; the browser
logged nothing to its console; every chart drew paths with data; the page has a section per run
of the session and a verdict-table row per judgement; and the screenshot was written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.browser import browse, screenshot

SIZE_LIMIT = 2_000_000
"""Bytes: the CPU suite's report must stay a file one opens from a CI artifact without waiting."""


def check(session: Path, report: Path, shot: Path) -> list[str]:
    """What is wrong with ``report``, the report of ``session`` (nothing: it passes); the screenshot goes to ``shot``."""
    problems = []
    size = report.stat().st_size
    if size >= SIZE_LIMIT:
        problems.append(f"{report}: {size:,} bytes, expected under {SIZE_LIMIT:,}")
    data = json.loads(session.read_text())
    runs = len(data["runs"])
    judgements = sum(len(verdicts["judgements"]) for verdicts in data["verdicts"])
    browsed = browse(report)
    problems += browsed.faults()
    points = browsed.dom.count('<details class="point"')
    if points != runs:
        problems.append(f"{points} point section(s) for the session's {runs} run(s)")
    rows = browsed.verdict_table().count('<tr class="v-')
    if rows != judgements:
        problems.append(f"{rows} verdict row(s) for the session's {judgements} judgement(s)")
    screenshot(report, shot)
    if not shot.is_file() or shot.stat().st_size == 0:
        problems.append(f"no screenshot at {shot}")
    print(f"{report}: {size:,} bytes, {runs} run(s), {rows} verdict row(s), {len(browsed.charts())} chart(s); screenshot {shot}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(*(Path(arg).resolve() for arg in argv))  # a browser opens a file by its absolute URI
    for problem in problems:
        print(f"report check: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
