"""The HTML report of real sessions on the CPU build, in a real browser: a plain session's report,
and the report of it against a session whose server is held to half a core by a CPU quota
(``benchmarks/quota_launcher.py``, as ``test_history_gate.py`` slows one), which must put the
regression first, name the slowdown's evidence among its likely causes and set the two sessions'
operator profiles side by side (both run with ``--qwenperf-profile``).

In Chromium (headless, the network cut off) each report logs nothing to the console, draws every
chart with data, and has one table row per verdict its sessions decided; a screenshot of each is
kept in the test's folder (``docs/report/*.png`` were taken the same way).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.gate.compare import load_runs
from pytest_qwenperf.report.page import page_of
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER
from tests.browser import Browsed, browse, screenshot
from tests.e2e.tiny import inner_session, suite_toml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

SUITE = suite_toml(
    "report",
    """
[[config]]
id = "tiny"

[[workload]]
name = "isl32-osl64"
kind = "random"
input_len = 32
output_len = 64
num_prompts = 64
warmup = 8
load = { concurrency = 8 }
""",
    suite="repeats = 4",
)
# Four repeats a side: two after a boot can differ by 40 % here, which leaves a halved server "noisy".
# Each load run lasts a few seconds, so the server's CPU (polled every 0.5 s) is read in its window.


def drawn(browsed: Browsed) -> None:
    """No console message, and every chart drawn as SVG with paths that carry data."""
    assert browsed.faults() == []


def test_reports_of_a_real_session_and_of_a_slowed_one_against_it(pytester: pytest.Pytester, tmp_path: Path) -> None:
    (pytester.path / "suite.toml").write_text(SUITE)
    pytester.makepyfile(test_baseline=(ROOT / "perf_tests" / "test_baseline.py").read_text())
    plain = inner_session(pytester, "test_baseline.py", "plain", "--qwenperf-no-history", "--qwenperf-profile", "--qwenperf-html=plain.html")
    plain.assert_outcomes(skipped=1)  # nothing to judge against
    quota = ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "benchmarks.quota_launcher", "--cores", "0.5", "--after-ready", "--"]
    slowed = inner_session(
        pytester,
        "test_baseline.py",
        "slowed",
        f"--qwenperf-launcher={shlex.join([*quota, *DEFAULT_LAUNCHER])}",
        "--qwenperf-no-history",
        "--qwenperf-profile",
    )
    slowed.assert_outcomes(skipped=1)

    # The plain session's own report: a row per verdict it decided, every chart drawn.
    session = json.loads((pytester.path / "plain.json").read_text())
    rows = sum(len(verdicts["judgements"]) for verdicts in session["verdicts"])
    assert rows > 0 and len(session["runs"]) == 1
    browsed = browse(pytester.path / "plain.html")
    drawn(browsed)
    body = browsed.verdict_table()
    assert body.count("<tr class=\"v-") == rows and body.count('href="#point-report-tiny-isl32-osl64"') == rows
    screenshot(pytester.path / "plain.html", tmp_path / "report-session.png")

    # The slowed session against it: the regression first, and why.
    assert main(["report", str(pytester.path / "plain.json"), str(pytester.path / "slowed.json"), "-o", str(pytester.path / "pair.html")]) == 0
    page = page_of([load_runs(pytester.path / "plain.json"), load_runs(pytester.path / "slowed.json")])
    assert page.rows[0].kind == "regression", [(row.metric, row.kind) for row in page.rows]
    ((_, causes),) = page.points[0].causes
    assert any(cause.startswith("telemetry: server CPU busy") for cause in causes), causes
    # TPOT roughly triples, but two plain repeats after a boot can differ by 40 %: the line states
    # the figures whether or not two repeats a side can call them beyond their noise.
    assert any(cause.startswith("latency-shape: ") and "mean TPOT (ms): " in cause for cause in causes), causes
    paired = browse(pytester.path / "pair.html")
    drawn(paired)
    assert "Likely causes" in paired.dom and "Largest share changes in" in paired.dom  # the profiles' diff
    assert len(page.points[0].operators) == 2
    screenshot(pytester.path / "pair.html", tmp_path / "report-pair.png")
