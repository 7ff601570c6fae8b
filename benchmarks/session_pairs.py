"""Do the CPU suite's shipped tolerances pass an A/A pair of sessions and fail a slowed one, as a
user runs ``qwenperf compare --fail-on regression`` on two session files?

Each round runs three whole ``pytest`` sessions of the cpu suite's ``base`` config on its
throughput point (``isl128-osl128``), with ``perf_tests/suites/cpu.toml`` as shipped, no stored
baseline and no history (each session stands alone, as a file a user would keep):

- ``A`` and ``A2``: the default launcher (an A/A pair);
- ``B``: the server inside a cgroup whose CFS quota allows ``--b-cores`` CPUs
  (:mod:`benchmarks.quota_launcher`): a server held to 85 % of its one core by default.

Then ``qwenperf compare A.json A2.json --fail-on regression`` and ``… A.json B.json …``, each
its exit status and output throughput verdict, ratio and MDE. The order of the three sessions
rotates between rounds. Files and a summary go to ``--out`` (a folder).

``--history N`` runs as a user with the default history does: ``N`` plain sessions first record
into ``OUT/history.sqlite``, and ``A`` and ``A2`` record into it too, so each carries how far this
runner's sessions differ (``runner_noise`` in its JSON) and ``qwenperf compare`` judges the pairs
on it. ``B`` runs without a history, so the slowed sessions never enter it; its pair is judged
on ``A``'s spread (compare takes the wider of the two runs').

    python -m benchmarks.session_pairs --rounds 2 --out benchmarks/results/session-pairs-<date>
    python -m benchmarks.session_pairs --rounds 4 --history 3 --out benchmarks/results/session-pairs-history-<date>
    python -m benchmarks.session_pairs --rounds 2 --metric capacity_at_slo --out benchmarks/results/capacity-pairs-<date> \
        --node 'perf_tests/test_baseline.py::test_no_regression_against_baseline[cpu-ctx-short/capacity-isl64-osl128]'

Needs the CPU build of vLLM, and root (or a delegated cgroup) for ``B``. A session takes about
two minutes on the 2-vCPU machine (a boot, 3-6 repeats of ~16 s).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = "perf_tests/test_baseline.py::test_no_regression_against_baseline[cpu-base/isl128-osl128]"
VLLM = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def session(out: Path, name: str, launcher: list[str] | None, history: str | None = None, node: str = NODE) -> dict[str, object]:
    """One whole ``pytest`` session of ``node``; ``history``: the store it records into (None: none)."""
    argv = [sys.executable, "-m", "pytest", node, "-p", "no:cacheprovider",
            f"--qwenperf-history={history}" if history else "--qwenperf-no-history",
            f"--qwenperf-baselines={out / 'no-baselines'}", f"--qwenperf-json={out / f'{name}.json'}",
            f"--qwenperf-log-dir={out / 'logs' / name}"]  # fmt: skip
    if launcher:
        argv.append(f"--qwenperf-launcher={shlex.join(launcher)}")
    began = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    return {"session": name, "exit": done.returncode, "wall_s": round(time.monotonic() - began, 1)}


def compare(out: Path, reference: str, other: str, metric: str = "output_throughput") -> dict[str, object]:
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "compare", str(out / f"{reference}.json"), str(out / f"{other}.json")]
    failing = subprocess.run([*argv, "--fail-on", "regression"], capture_output=True, text=True, check=False)
    document = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True).stdout)
    judged = [
        j for group in document["groups"] for row in group["rows"] if row["metric"] == metric
        for j in row["judgements"] if j is not None
    ]  # fmt: skip
    (out / f"compare-{reference}-{other}.txt").write_text(failing.stdout + failing.stderr)
    first = judged[0] if judged else {}
    return {"pair": f"{reference} vs {other}", "exit": failing.returncode, "verdict": first.get("verdict"),
            "ratio": first.get("ratio"), "mde": first.get("mde"), "between": first.get("between")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--b-cores", type=float, default=0.85)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--history", type=int, metavar="N", help="N plain sessions seed a history that A and A2 record into")
    parser.add_argument("--node", default=NODE, help="the test each session runs (default: the base config's throughput point)")
    parser.add_argument("--metric", default="output_throughput", help="the verdict reported per pair")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=False)
    store = str(args.out / "history.sqlite") if args.history is not None else None
    seeds = [session(args.out, f"H-{i + 1}", None, store, args.node) for i in range(args.history or 0)]
    quota = ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "benchmarks.quota_launcher", "--cores", str(args.b_cores), "--"]
    arms = {"A": None, "A2": None, "B": [*quota, *VLLM]}
    rounds = []
    for r in range(args.rounds):
        order = list(arms)[r % 3 :] + list(arms)[: r % 3]
        sessions = [session(args.out, f"{arm}-{r + 1}", arms[arm], store if arm != "B" else None, args.node) for arm in order]
        pairs = [compare(args.out, f"A-{r + 1}", f"A2-{r + 1}", args.metric), compare(args.out, f"A-{r + 1}", f"B-{r + 1}", args.metric)]
        rounds.append({"round": r + 1, "order": order, "sessions": sessions, "pairs": pairs})
        (args.out / "summary.json").write_text(json.dumps({"b_cores": args.b_cores, "seeds": seeds, "rounds": rounds}, indent=2))
        for pair in pairs:
            print(json.dumps(pair), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
