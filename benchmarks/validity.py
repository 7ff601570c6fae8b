"""What run validity sees on the CPU default: the server's core alone, and shared with a busy process.

One server of the cpu suite's ``base`` config (pinned as the plugin pins it: all CPUs but the last;
the load generator on the last) runs the suite's throughput workload once per load run, in rounds
of two: the core left alone, then the same core shared with a busy process started outside this
process's tree (as another job on a shared runner is), in alternating order (A B, B A, ...). Each
load run's figures are what the gate judges validity on (the run's ``telemetry.cpu.server_cores``
and ``conditions``) and its output throughput, so the cost of the competitor is seen beside
whether the gate called it. Raw results go to a JSON file, rewritten after every load run.

    python -m benchmarks.validity --rounds 4 --out benchmarks/results/validity-<date>.json
    python -m benchmarks.validity --analyse benchmarks/results/validity-<date>.json

Needs the CPU build of vLLM and two CPUs. About 15 s a load run on the 2-vCPU machine, plus one boot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.run import measure
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import placement
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.suite.config import load_suite

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "perf_tests" / "suites" / "cpu.toml"
SCHEMA = "qwenperf-validity-figures/1"
SPIN = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.monotonic() + float(sys.argv[2])\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def competitor(cpus: frozenset[int], lasts_s: float = 600.0) -> Iterator[list[int]]:
    """One spinning process per CPU, each reparented away from this process (a shell starts it in
    the background and exits), so it belongs to neither the server nor the load generator; each
    ends by itself after ``lasts_s`` even if this process is killed, and is killed on the way out."""
    pids = []
    for cpu in sorted(cpus):
        shell = f"{sys.executable} -c '{SPIN}' {cpu} {lasts_s} </dev/null >/dev/null 2>&1 & echo $!"
        pids.append(int(subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True, timeout=30).stdout))
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def figures(run: Any, arm: str, competitors: Sequence[int]) -> dict[str, Any]:
    cores = ((run.telemetry or {}).get("cpu") or {}).get("server_cores") or {}
    others = cores.get("others_busy") or {}
    return {
        "arm": arm,
        "output_throughput": run.metrics["output_throughput"],
        "contended_share": cores.get("contended_share"),
        "others_mean": others.get("mean"),
        "others_max": others.get("max"),
        "steal_share": cores.get("steal_share"),
        "busiest_others": cores.get("busiest_others"),
        "competitors": list(competitors),
        "conditions": [loss.reason for loss in run.conditions],
    }


def analyse(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for arm in ("alone", "shared"):
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        named = sum(1 for r in mine if set(r["competitors"]) & {o["pid"] for o in r["busiest_others"]})
        invalid = sum(1 for r in mine if "cpu-contention" in r["conditions"])
        out = [r["output_throughput"] for r in mine]
        lines.append(
            f"{arm}: {len(mine)} load runs; contended share {_span([r['contended_share'] for r in mine])}; "
            f"others' cores mean {_span([r['others_mean'] for r in mine])}, max {_span([r['others_max'] for r in mine])}; "
            f"steal {_span([r['steal_share'] for r in mine])}; cpu-contention in {invalid} of {len(mine)}; "
            f"competitor named in {named} of {len(mine) if arm == 'shared' else 0}; "
            f"output tok/s median {statistics.median(out):,.0f} ({min(out):,.0f}-{max(out):,.0f})"
        )
    return lines


def _span(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return "—" if not known else f"{min(known):.3f}-{max(known):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--analyse", type=Path, metavar="JSON", help="report on a results file instead of measuring")
    args = parser.parse_args(argv)
    if args.analyse:
        print("\n".join(analyse(json.loads(args.analyse.read_text())["runs"])))
        return 0
    if args.out is None:
        parser.error("--out is needed to measure")
    suite = load_suite(SUITE)
    cfg = suite.config("base")
    workload = next(w for w in suite.workloads if w.id == "isl128-osl128")
    placed = placement(cfg, detect())
    document: dict[str, Any] = {"schema": SCHEMA, "machine": msgspec.to_builtins(detect().machine()), "server_cpus": sorted(placed.server_cpus), "runs": []}
    with tempfile.TemporaryDirectory(prefix="qwenperf-validity-") as logs:
        pool = ServerPool(PoolSettings(log_dir=Path(logs)))
        try:
            server = pool.get(cfg, placed.server_cpus)
            for n in range(args.rounds):
                for arm in ("alone", "shared") if n % 2 == 0 else ("shared", "alone"):
                    with competitor(placed.server_cpus) if arm == "shared" else contextlib.nullcontext([]) as pids:
                        run = measure(server, cfg, workload, Method.of(suite, repeats(1), ClientSetup(cpus=placed.client_cpus)))
                    document["runs"].append(figures(run, arm, pids))
                    write_atomically(args.out, json.dumps(document, indent=1))
                    print(f"round {n + 1} {arm}: {document['runs'][-1]['conditions']}", flush=True)
        finally:
            pool.close()
    print("\n".join(analyse(document["runs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
