"""How well does ``--qwenperf-candidate`` tell two vLLMs apart on the CPU default, as a user runs it?

Each session is one whole ``pytest`` command: the cpu suite's ``base`` config on its
throughput workload, the reference booted by the default launcher and the candidate beside
it, repeats interleaved, extra repeats while the verdict is undecided, exactly as a user
would gate an upgrade. The suite is a copy of ``perf_tests/suites/cpu.toml`` whose
throughput tolerances are ``--tolerance`` (the question is whether the gate can afford a
small one). Arms:

- ``AA``: the candidate is the same vLLM (false alarms, and how far two boots of one vLLM differ);
- ``B``: the candidate runs inside a cgroup whose CFS quota allows ``--b-cores`` CPUs
  (:mod:`benchmarks.quota_launcher`), a slowdown of known cause whose size is measured,
  not assumed (the ratio of the two sides).

Sessions alternate the arms. The raw results (every repeat of both sides, the session's
exit status and wall time) go to a JSON file, rewritten after every session. ``--analyse``
judges each session again with the gate's rule at the confidence of its last look, and
reports per arm: the ratios, the verdicts, the MDEs, and, for ``AA``, the spread of the
log-ratio between sessions against the spread within them (what a second boot adds).

    python -m benchmarks.interleaved --sessions 5 --b-cores 0.89 --tolerance 0.10
    python -m benchmarks.interleaved --analyse benchmarks/results/interleaved-<date>.json

Needs the CPU build of vLLM, and root (or a delegated cgroup) for the ``B`` arm. A session
takes 3-5 minutes on the 2-vCPU machine (two boots, 3-6 repeats a side of ~16 s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.verdict import DEFAULT_CONFIDENCE, Hearing, Side, judge

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "perf_tests" / "suites" / "cpu.toml"
NODE = "perf_tests/test_baseline.py::test_no_regression_against_baseline[cpu-base/isl128-osl128]"
METRICS = ("output_throughput", "tokens_per_server_cpu_s", "p99_tpot_ms")
TOLERANCED = ("output_throughput", "total_token_throughput", "request_throughput", "tokens_per_server_cpu_s")
SCHEMA = "qwenperf-interleaved/1"
VLLM = f"{shlex.quote(sys.executable)} -m vllm.entrypoints.openai.api_server"


def suite_text(tolerance: float) -> str:
    """``cpu.toml`` with the throughput tolerances set to ``tolerance`` (the rest as it is)."""
    text = SUITE.read_text()
    tolerances = dict(tomllib.loads(text)["suite"]["tolerances"]) | dict.fromkeys(TOLERANCED, tolerance)
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("tolerances = {")]
    lines[at] = "tolerances = { " + ", ".join(f"{name} = {value}" for name, value in tolerances.items()) + " }"
    return "\n".join(lines) + "\n"


def candidate_of(arm: str, b_cores: float) -> str:
    if arm == "AA":
        return VLLM
    return f"{shlex.quote(sys.executable)} -m benchmarks.quota_launcher --cores {b_cores} -- {VLLM}"


def _side(path: Path) -> dict[str, Any]:
    """One side's run: the samples of :data:`METRICS`, its extra repeats and what made it invalid."""
    (run,) = json.loads(path.read_text())["runs"]
    return {
        "samples": {name: run["samples"].get(name) for name in METRICS},
        "extra_repeats": run.get("extra_repeats", 0),
        "failed_requests": run.get("failed_requests", 0),
        "client_bound": (run.get("client") or {}).get("bound"),
        "vllm_version": (run.get("context") or {}).get("vllm_version"),
    }


def run_sessions(args: argparse.Namespace) -> int:
    out = args.out or ROOT / "benchmarks" / "results" / f"interleaved-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%SZ}.json"
    arms = args.arms.split(",")
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "command": shlex.join(["python", "-m", "benchmarks.interleaved", *sys.argv[1:]]),
        "tolerance": args.tolerance,
        "b_cores": args.b_cores,
        "repeats": args.repeats,
        "max_repeats": args.max_repeats,
        "sessions": [],
    }
    print(f"results: {out}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as folder:
        suite = Path(folder) / "cpu.toml"
        suite.write_text(suite_text(args.tolerance))
        for i in range(args.sessions * len(arms)):
            arm = arms[i % len(arms)]
            json_path = Path(folder) / f"s{i}.json"
            command = [
                sys.executable, "-m", "pytest", NODE, "-p", "no:cacheprovider", "-q",
                f"--qwenperf-suite={suite}",
                f"--qwenperf-candidate={candidate_of(arm, args.b_cores)}",
                f"--qwenperf-repeats={args.repeats}",
                f"--qwenperf-max-repeats={args.max_repeats}",
                f"--qwenperf-json={json_path}",
            ]  # fmt: skip
            started = time.monotonic()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            wall = time.monotonic() - started
            session: dict[str, Any] = {"arm": arm, "exit_status": done.returncode, "wall_s": round(wall, 1)}
            reference = json_path.with_name(f"{json_path.stem}.reference.json")
            if json_path.exists() and reference.exists():
                session |= {"reference": _side(reference), "candidate": _side(json_path)}
            else:
                session["output_tail"] = (done.stdout + done.stderr)[-3000:]
            results["sessions"].append(session)
            write_atomically(out, json.dumps(results, indent=2))
            print(f"session {i + 1} {arm}: exit {done.returncode}, {wall:.0f} s, {_brief(session)}", file=sys.stderr)
    print(f"done: {out}\nanalyse with: python -m benchmarks.interleaved --analyse {out}", file=sys.stderr)
    return 0


def _brief(session: Mapping[str, Any]) -> str:
    if "candidate" not in session:
        return "no results (see output_tail)"
    ref, cand = (statistics.median(session[s]["samples"]["output_throughput"]) for s in ("reference", "candidate"))
    n = len(session["candidate"]["samples"]["output_throughput"])
    return f"{n} repeats a side, output tok/s {ref:,.0f} -> {cand:,.0f} ({cand / ref - 1:+.1%})"


def judged(session: Mapping[str, Any], name: str, tolerance: float, plan: SequentialPlan, skip: int = 0) -> dict[str, Any]:
    """The candidate against the reference on ``name``, at the confidence of the session's last look;
    ``skip``: leave out each side's first repeats (the first after the servers booted)."""
    info = metric(name)
    ref, cand = (tuple(session[s]["samples"][name])[skip:] for s in ("reference", "candidate"))
    confidence = plan.confidence_at(len(cand) + skip)
    sides = Side(ref), Side(cand)
    j = judge(Hearing(name, *sides, direction=info.direction, tolerance=tolerance, unit=info.unit, confidence=confidence))
    logs = [statistics.stdev(math.log(v) for v in side) if len(side) > 1 else None for side in (ref, cand)]
    return {"verdict": j.verdict, "ratio": j.ratio, "mde": j.mde, "repeats": len(cand), "log_sd": logs}


def analyse(results: Mapping[str, Any], skip: int = 0) -> dict[str, Any]:
    """Per arm and metric: each session's verdict (at the tolerance it ran with), ratio and MDE; their
    counts and spreads. ``skip``: as :func:`judged` (what discarding the repeats after boot would buy)."""
    tolerance = results["tolerance"]
    plan = SequentialPlan(DEFAULT_CONFIDENCE, results["repeats"], results["max_repeats"])
    complete = [s for s in results["sessions"] if "candidate" in s]
    analysis: dict[str, Any] = {"tolerance": tolerance, "skipped_repeats": skip, "sessions": len(results["sessions"]), "complete": len(complete), "arms": {}}
    for arm in dict.fromkeys(s["arm"] for s in complete):
        sessions = [s for s in complete if s["arm"] == arm]
        per_metric = {}
        for name in METRICS:
            rows = [judged(s, name, tolerance, plan, skip) for s in sessions]
            log_ratios = [math.log(r["ratio"]) for r in rows if r["ratio"]]
            within = [sd for r in rows for sd in r["log_sd"] if sd is not None]
            per_metric[name] = {
                "sessions": rows,
                "verdicts": dict(sorted(Counter(r["verdict"] for r in rows).items())),
                "median_ratio": math.exp(statistics.median(log_ratios)) if log_ratios else None,
                "median_mde": statistics.median(r["mde"] for r in rows if r["mde"] is not None) if rows else None,
                "between_sessions_log_sd": statistics.stdev(log_ratios) if len(log_ratios) > 1 else None,
                # what the log-ratio's spread would be from the repeats' own spread alone
                "expected_log_sd": math.sqrt(2 * statistics.fmean(sd**2 for sd in within) / statistics.fmean(r["repeats"] for r in rows))
                if within
                else None,
            }
        exits = Counter(s["exit_status"] for s in sessions)
        analysis["arms"][arm] = {
            "sessions": len(sessions),
            "exit_statuses": {str(k): v for k, v in sorted(exits.items())},
            "median_wall_s": statistics.median(s["wall_s"] for s in sessions),
            "extra_repeats": [s["candidate"]["extra_repeats"] for s in sessions],
            "metrics": per_metric,
        }
    return analysis


def print_analysis(analysis: Mapping[str, Any]) -> None:
    skipped = f"; each side's first {analysis['skipped_repeats']} repeat(s) left out" if analysis["skipped_repeats"] else ""
    print(f"tolerance {analysis['tolerance']:.0%}; {analysis['complete']} of {analysis['sessions']} sessions complete{skipped}")
    for arm, facts in analysis["arms"].items():
        print(
            f"\n{arm}: {facts['sessions']} sessions, exit statuses {facts['exit_statuses']}, median wall {facts['median_wall_s']:.0f} s, "
            f"extra repeats per session {facts['extra_repeats']}"
        )
        for name, m in facts["metrics"].items():
            ratios = ", ".join(f"{r['ratio'] - 1:+.1%}" for r in m["sessions"] if r["ratio"])
            between, expected = m["between_sessions_log_sd"], m["expected_log_sd"]
            spread = f"; log-ratio SD between sessions {between:.3f} vs {expected:.3f} from the repeats" if between and expected else ""
            print(
                f"  {name}: verdicts {m['verdicts']}; median change {m['median_ratio'] - 1:+.1%}, "
                f"median MDE {m['median_mde']:.1%}{spread}\n    changes: {ratios}"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5, help="sessions per arm (default %(default)s)")
    parser.add_argument("--arms", default="AA,B", help="arms in the order they alternate (default %(default)s)")
    parser.add_argument("--b-cores", type=float, default=0.89, help="CPUs the B arm's candidate may use (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="the suite's throughput tolerances (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats a side (default %(default)s)")
    parser.add_argument("--max-repeats", type=int, default=6, help="most repeats a side (default %(default)s)")
    parser.add_argument("--out", type=Path, help="results file (default benchmarks/results/interleaved-<UTC date-time>.json)")
    parser.add_argument("--analyse", type=Path, metavar="FILE", help="analyse a results file instead of measuring")
    parser.add_argument("--json", action="store_true", help="--analyse: print the analysis as JSON")
    parser.add_argument("--skip", type=int, default=0, help="--analyse: leave out each side's first repeats (default 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.analyse is not None:
        analysis = analyse(json.loads(args.analyse.read_text()), skip=args.skip)
        if args.json:
            print(json.dumps(analysis, indent=2))
        else:
            print_analysis(analysis)
        return 0
    return run_sessions(args)


if __name__ == "__main__":
    sys.exit(main())
