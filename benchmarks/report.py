"""The HTML report's size and cost for a b200-sized comparison, and what matplotlib SVG would cost instead.

Two session files of the b200 suite's size (8 rungs x 4 workloads, each run with a full timeline:
240 bins of every series, and its latency distributions; ``tests/test_report.py`` builds them) are
compared into one report. Measured, in interleaved rounds:

* ``qwenperf report A.json B.json -o report.html``: the whole command's wall time, and the file's size;
* Debian's Chromium drawing it (``--headless --dump-dom``, the network cut off, until every chart is
  drawn): the whole command's wall time, against the same command on an empty page (the browser's
  own start) in the same round;
* the alternative, the same charts as matplotlib SVG (one figure of 9 panels per run's timeline, one
  of 4 per point's distributions, both sides on it): time to draw them in this process and their
  bytes, which an SVG report would embed instead of the Vega runtime and the specs.

    python -m benchmarks.report --rounds 3 --out report.json
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_qwenperf.core.summary import QUANTILES
from pytest_qwenperf.core.timeline import SERIES
from tests.test_report import run_with, session, timeline_of

RUNGS, WORKLOADS, BINS = 8, 4, 240


def sessions(folder: Path) -> list[Path]:
    runs = []
    for i in range(RUNGS):
        for j in range(WORKLOADS):
            run = run_with("base", "isl128-osl128", output=5_000.0 + 100 * i)
            run["identity"] |= {"config": f"rung{i}", "workload": f"w{j}"}
            run["timeline"] = timeline_of(BINS)
            runs.append(run)
    return [session(folder / f"{side}.json", runs) for side in ("a", "b")]


def wall(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - began


def browser(page: Path) -> list[str]:
    chromium = shutil.which("chromium") or sys.exit("needs Debian's chromium")
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
            "--virtual-time-budget=60000", "--dump-dom", page.as_uri()]  # fmt: skip


def matplotlib_svg(points: int) -> tuple[float, int]:
    """Seconds and bytes to draw the charts of ``points`` compared points as matplotlib SVG: each
    side's timeline, and one figure of both sides' distributions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [float(i % 7) + 0.5 for i in range(BINS)]
    began, size = time.perf_counter(), 0
    for _ in range(points):
        figures = []
        for _side in range(2):
            figure, axes = plt.subplots(len(SERIES), 1, figsize=(7, 9), sharex=True)
            for ax, name in zip(axes, SERIES, strict=True):
                ax.step(range(BINS), values, where="post")
                ax.axvspan(5, BINS - 5, alpha=0.15)
                ax.set_title(SERIES[name], fontsize=8, loc="left")
            figures.append(figure)
        cdf, cdf_axes = plt.subplots(2, 2, figsize=(7, 4))
        for ax in cdf_axes.flat:
            for side in range(2):
                ax.plot([q + 1 + side for q in QUANTILES], [q / 100 for q in QUANTILES])
            ax.set_xscale("log")
        for fig in (*figures, cdf):
            out = io.StringIO()
            fig.savefig(out, format="svg")
            size += len(out.getvalue().encode())
            plt.close(fig)
    return time.perf_counter() - began, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        a, b = sessions(folder)
        report, blank = folder / "report.html", folder / "blank.html"
        blank.write_text("<!doctype html><title>blank</title><p>blank</p>")
        rounds = []
        for _ in range(args.rounds):
            report.unlink(missing_ok=True)
            write_s = wall([sys.executable, "-m", "pytest_qwenperf.cli.main", "report", str(a), str(b), "-o", str(report)])
            dom = subprocess.run(browser(report), check=True, capture_output=True, text=True, timeout=300).stdout
            if 'data-charts="drawn"' not in dom:
                sys.exit("the browser did not draw every chart")
            rounds.append({
                "write_s": write_s,
                "bytes": report.stat().st_size,
                "browser_s": wall(browser(report)),
                "blank_browser_s": wall(browser(blank)),
            })  # fmt: skip
        svg_s, svg_bytes = matplotlib_svg(RUNGS * WORKLOADS)
    result = {
        "points": RUNGS * WORKLOADS,
        "sides": 2,
        "rounds": rounds,
        "median": {key: statistics.median(r[key] for r in rounds) for key in rounds[0]},
        "matplotlib_svg": {"draw_s": svg_s, "bytes": svg_bytes},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
