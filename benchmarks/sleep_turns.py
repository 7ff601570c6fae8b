"""Does taking turns through sleep mode move the figures? A/A sessions with turns against A/A without.

Each session is one whole ``pytest`` command with ``--qwenperf-candidate``, both sides the same
stand-in, so the candidate's true ratio to the reference is 1: the paced stand-in
(tests/standins/paced_vllm.py: a token every ``--itl-ms``), or with ``--standin model`` the model
stand-in (tests/standins/model_vllm.py: the tiny model decoded by torch on ``--device``; on a GPU its
weights really leave the device while it sleeps). Arms, alternating:

- ``turns``: a GPU suite (an H200 through the NVML stand-in, the GPU build's parser and platform
  through tests/standins/gpu_build_vllm): both servers boot in sleep mode and take turns, the one
  measured awake, the other asleep, a sleep and a wake-up at each change of side;
- ``awake``: the same suite as a CPU suite: both awake side by side, as on the CPU build.

Per arm: the ratio of the candidate's median output throughput to the reference's in each session,
their mean and spread, the verdicts and MDEs, the wall time, and the turns each session took. What it
shows: whether the turns' routes, their order and the first repeat after a wake-up leak into what is
measured. What it does not: a real vLLM's wake-up (its KV cache allocated again, its weights copied
back), which only a GPU can show; each repeat warms up after its wake-up for that reason.

    python -m benchmarks.sleep_turns --sessions 4
    python -m benchmarks.sleep_turns --sessions 2 --standin model --device cuda   # on a GPU node (scripts/gpu-check)

Runs on any machine with the dev install (vLLM is asked nothing: the stand-ins answer); a session takes
a few seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.serving.hardware import detect
from tests.test_candidate import GATE, PACED
from tests.test_model_standin import STANDIN as MODEL_STANDIN
from tests.test_sleep import FAKE_GPU, GPU_SUITE, wrapper_python

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "qwenperf-sleep-turns/1"
WORKLOAD = ("num_prompts = 4", "num_prompts = 64\nwarmup = 8")
TURNS = re.compile(r"took turns on the GPUs through vLLM's sleep mode: (\d+) wake-up\(s\) and (\d+) sleep\(s\)")


def folder_for(arm: str, base: Path, args: argparse.Namespace) -> tuple[Path, str]:
    """The session's folder (suite, test, conftest) and its launcher."""
    folder = base / arm
    folder.mkdir()
    suite = GPU_SUITE.replace(*WORKLOAD).replace("load = { concurrency = 1 }", "load = { concurrency = 8 }")
    if arm == "awake":
        suite = suite.replace('hardware = "h200"\ngpus = 1\n', 'hardware = "cpu"\n')
    elif args.real_nvml:
        suite = suite.replace('hardware = "h200"', f'hardware = "{detect().kind}"')  # this node's kind of GPU
    else:
        (folder / "conftest.py").write_text(FAKE_GPU)
    (folder / "suite.toml").write_text(suite)
    (folder / "test_gate.py").write_text(GATE)
    python = shlex.quote(str(wrapper_python(folder) if arm == "turns" else Path(sys.executable)))
    if args.standin == "model":
        return folder, f"{python} {shlex.quote(MODEL_STANDIN[1])} --device {shlex.quote(args.device)}"
    return folder, f"{python} {shlex.quote(str(PACED))} --itl-ms {args.itl_ms}"


def session(arm: str, folder: Path, launcher: str, repeats: int) -> dict[str, Any]:
    out = folder / "results.json"
    for old in (out, out.with_name("results.reference.json")):
        old.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--qwenperf-no-history",
        "--qwenperf-suite=suite.toml", f"--qwenperf-launcher={launcher}", f"--qwenperf-candidate={launcher}",
        f"--qwenperf-repeats={repeats}", f"--qwenperf-json={out}",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    found: dict[str, Any] = {"arm": arm, "exit_status": done.returncode, "wall_s": round(wall, 2)}
    reference = out.with_name("results.reference.json")
    if not (out.exists() and reference.exists()):
        return found | {"output_tail": (done.stdout + done.stderr)[-3000:]}
    (cand,) = json.loads(out.read_text())["runs"]
    (ref,) = json.loads(reference.read_text())["runs"]
    (verdicts,) = json.loads(out.read_text())["verdicts"]
    judged = {j["metric"]: j for j in verdicts["judgements"]}["output_throughput"]
    turns = TURNS.search(done.stdout)
    return found | {
        "reference": ref["samples"]["output_throughput"],
        "candidate": cand["samples"]["output_throughput"],
        "failed": [ref["metrics"]["failed"], cand["metrics"]["failed"]],
        "verdict": judged["verdict"],
        "mde": judged["mde"],
        "turns": None if turns is None else {"wakes": int(turns[1]), "sleeps": int(turns[2])},
    }


def summary(sessions: list[dict[str, Any]]) -> list[str]:
    lines = []
    for arm in ("turns", "awake"):
        done = [s for s in sessions if s["arm"] == arm and "candidate" in s]
        ratios = [statistics.median(s["candidate"]) / statistics.median(s["reference"]) for s in done]
        if not ratios:
            lines.append(f"{arm}: no session gave results")
            continue
        spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        lines.append(
            f"{arm}: {len(done)} session(s), candidate/reference {statistics.fmean(ratios):.4f} (sd {spread:.4f}, "
            f"range {min(ratios):.4f}-{max(ratios):.4f}); verdicts {sorted(s['verdict'] for s in done)}; "
            f"median MDE {statistics.median(s['mde'] for s in done):.2%}; failed requests {sum(sum(s['failed']) for s in done)}; "
            f"median wall {statistics.median(s['wall_s'] for s in done):.1f} s; turns {[s['turns'] for s in done][:1]}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4, help="sessions per arm, the arms alternating")
    parser.add_argument("--repeats", type=int, default=3, help="repeats a side")
    parser.add_argument("--standin", choices=("paced", "model"), default="paced", help="which stand-in both sides run")
    parser.add_argument("--itl-ms", type=float, default=5.0, help="the paced stand-ins' gap between tokens")
    parser.add_argument("--device", default="cpu", help="the model stand-ins' torch device (cuda on a GPU node)")
    parser.add_argument("--real-nvml", action="store_true", help="the machine's own NVML (a GPU node), not the H200 stand-in")
    parser.add_argument("--out", type=Path, help="the JSON results (default benchmarks/results/sleep_turns-<date>.json)")
    args = parser.parse_args()
    out = args.out or ROOT / "benchmarks" / "results" / f"sleep_turns-{datetime.datetime.now(datetime.UTC):%Y-%m-%d}.json"
    results: dict[str, Any] = {"schema": SCHEMA, "command": shlex.join(["python", "-m", "benchmarks.sleep_turns", *sys.argv[1:]]), "sessions": []}
    with tempfile.TemporaryDirectory() as base:
        folders = {arm: folder_for(arm, Path(base), args) for arm in ("turns", "awake")}
        for i in range(2 * args.sessions):
            arm = ("turns", "awake")[i % 2]
            found = session(arm, *folders[arm], args.repeats)
            results["sessions"].append(found)
            write_atomically(out, json.dumps(results, indent=2))
            print(f"session {i + 1} {arm}: exit {found['exit_status']}, {found['wall_s']} s, {found.get('verdict', 'no results')}", file=sys.stderr)
    results["summary"] = summary(results["sessions"])
    write_atomically(out, json.dumps(results, indent=2))
    print("\n".join(results["summary"]))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
