"""A real public trace replayed at its own pace on the CPU build: how late the client sends.

The trace is a window of Mooncake's conversation trace (``tests/data/traces``, its README says
where from), fitted to the tiny model's 2,048-token context (``--trace-fit scale``: lengths and
blocks scaled by 1/64, send times untouched). ``qwenperf bench`` replays it at its traced times
(``--time-scale 1``) against one CPU vLLM server (the tiny model, prefix caching on, eager; its
cache emptied before each round, or a round would hit the blocks of the one before),
the server pinned to every CPU but the last and the client to the last, as a user would run it.
A request's lag is how much later it was written than the trace says (``sent_at -
scheduled_at``); the trace sends its requests in bursts every 3 s, up to 16 in one millisecond
in this window. Each round is one whole command; the figures are per round and their median.

Target: p99 lag at most 2 ms (median over rounds), the prompt and output tokens the server
counted equal to the fitted trace's; exit status 1 when either is missed. Run alone.

    python -m benchmarks.trace_replay --rounds 3 --out trace-replay.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_qwenperf.measure.run import reset_prefix_caches
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER, ManagedServer
from pytest_qwenperf.suite.config import tiny_cpu_config

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "traces" / "mooncake-conversation-180s.jsonl"
START_S, SPAN_S = 0.0, 60.0
TARGET_P99_MS = 2.0
SERVER = tiny_cpu_config("tiny-prefix-cache", ("--enable-prefix-caching", "--enforce-eager"))


def replay(url: str, client_cpu: int, out: Path) -> dict[str, object]:
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", url, "--progress", "off",
            "--dataset-name", "trace", "--dataset-path", str(TRACE), "--trace-start", str(START_S), "--trace-span", str(SPAN_S),
            "--trace-fit", "scale", "--time-scale", "1", "--json", str(out)]  # fmt: skip
    done = subprocess.run(["taskset", "-c", str(client_cpu), *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"qwenperf bench failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(out.read_text())
    metrics, trace = result["metrics"], result["trace"]
    line = next(line for line in done.stdout.splitlines() if line.startswith("Trace replay"))
    return {
        "p50_ms": metrics["p50_scheduling_lag_ms"],
        "p99_ms": metrics["p99_scheduling_lag_ms"],
        "max_ms": metrics["max_scheduling_lag_ms"],
        "completed": metrics["completed"],
        "failed": metrics["failed"],
        "tokens_match": result["token_check"]["matches"],
        "input_tokens": metrics["total_input_tokens"],
        "output_tokens": metrics["total_output_tokens"],
        "cacheable_share": trace["cacheable_share"],
        "hit_rate": result["server"]["deltas"].get("prefix_cache_hits", 0) / (result["server"]["deltas"].get("prefix_cache_queries") or 1),
        "client_bound": result["client"]["bound"],
        "line": line,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpu = frozenset(cpus[:-1]), cpus[-1]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp, ManagedServer(
        server_spec(SERVER, launcher=DEFAULT_LAUNCHER, boot_timeout_s=600, cpus=server_cpus), Path(tmp)
    ) as server:
        for n in range(args.rounds):
            if not reset_prefix_caches([server.base_url]):  # each round as the first: a cold prefix cache
                raise SystemExit("the server's prefix cache could not be reset")
            rounds.append(replay(server.base_url, client_cpu, Path(tmp) / f"round-{n}.json"))
            shown = {k: v for k, v in rounds[-1].items() if k != "line"}
            print(f"round {n + 1}: {shown}\n  {rounds[-1]['line']}", file=sys.stderr)
    median = {key: statistics.median(float(r[key]) for r in rounds) for key in ("p50_ms", "p99_ms", "max_ms")}
    result = {"trace": str(TRACE.relative_to(ROOT)), "window_s": [START_S, START_S + SPAN_S], "rounds": rounds, "median": median}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(median))
    exact = all(r["tokens_match"] is True and r["failed"] == 0 for r in rounds)
    return 0 if median["p99_ms"] <= TARGET_P99_MS and exact else 1


if __name__ == "__main__":
    sys.exit(main())
