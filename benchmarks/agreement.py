"""Does ``qwenperf bench`` read the same throughput as ``vllm bench serve``?

Boots the CPU build of vLLM on the tiny model, pinned to the first CPU, and runs both
tools in turn on the last CPU with the same workload: random prompts of 128 tokens,
128 output tokens with ``ignore_eos``, 32 requests in flight, 256 measured requests after
32 warm-up requests, greedy sampling, prefix caching off. Runs are interleaved ABBA (ours, theirs, theirs, ours, ...) so
that drift of the machine hits both alike; the verdict compares the medians of
``output_throughput``. Prints a markdown table and writes every figure as JSON.

    python -m benchmarks.agreement --rounds 3 --out agreement.json
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

from benchmarks.commands import Requests, qwenperf_bench, turns, vllm_bench_serve
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER, ManagedServer
from pytest_qwenperf.suite.config import tiny_cpu_config
from pytest_qwenperf.suite.embedded import TINY_MODEL_NAME, resolve_model

TOLERANCE = 0.05
WORKLOAD = {"input_len": 128, "output_len": 128, "num_prompts": 256, "warmup": 32, "concurrency": 32}


# Prefix caching off: the two tools' random prompts are different token ids, and vLLM's
# hit the cache (about 15 % of prompt tokens per run here) where ours never do, so with it
# on the server does less work for theirs and the comparison is not of the instruments.
SERVER = tiny_cpu_config("tiny-no-prefix-cache", ("--no-enable-prefix-caching",))


def tiny_server(cpus: frozenset[int], log_dir: Path) -> ManagedServer:
    """The benchmarks' server (:data:`SERVER`) pinned to ``cpus``; use it as a context manager."""
    return ManagedServer(server_spec(SERVER, launcher=DEFAULT_LAUNCHER, boot_timeout_s=600, cpus=cpus), log_dir)


def _requests(url: str) -> Requests:
    return Requests(url, WORKLOAD["input_len"], WORKLOAD["output_len"], WORKLOAD["num_prompts"], WORKLOAD["concurrency"], WORKLOAD["warmup"])


def ours(url: str, client_cpu: int, out: Path) -> float:
    _run(["taskset", "-c", str(client_cpu), *qwenperf_bench(_requests(url), out)])
    return float(json.loads(out.read_text())["metrics"]["output_throughput"])


def theirs(url: str, client_cpu: int, out: Path) -> float:
    argv = vllm_bench_serve(_requests(url), out, TINY_MODEL_NAME, resolve_model("embedded:tiny"), "--temperature", "0")
    _run(["taskset", "-c", str(client_cpu), *argv])
    return float(json.loads(out.read_text())["output_throughput"])


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "CI": "1"}, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the server, one for the clients")
    server_cpus, client_cpu = frozenset(cpus[:-1]), cpus[-1]
    figures: dict[str, list[float]] = {"qwenperf bench": [], "vllm bench serve": []}
    with tempfile.TemporaryDirectory() as tmp, tiny_server(server_cpus, Path(tmp)) as server:
        info = server.info[0]
        tools = {"qwenperf bench": ours, "vllm bench serve": theirs}
        for n in range(args.rounds):
            for tool in turns(list(tools), n):
                figures[tool].append(tools[tool](server.base_url, client_cpu, Path(tmp) / f"{tool.split()[0]}-{n}.json"))
            print(f"round {n + 1}: ours {figures['qwenperf bench'][-1]:,.0f}, theirs {figures['vllm bench serve'][-1]:,.0f} output tok/s", file=sys.stderr)
    medians = {tool: statistics.median(values) for tool, values in figures.items()}
    ratio = medians["qwenperf bench"] / medians["vllm bench serve"]
    agree = abs(ratio - 1) <= TOLERANCE
    print(f"vLLM {info.version}, server on CPU {','.join(map(str, sorted(server_cpus)))}, clients on CPU {client_cpu}\n")
    print("| tool | output tok/s per run | median |")
    print("| --- | --- | --- |")
    for tool, values in figures.items():
        print(f"| `{tool}` | {' / '.join(f'{v:,.0f}' for v in values)} | {medians[tool]:,.0f} |")
    print(f"\nratio of medians {ratio:.3f}: {'within' if agree else 'OUTSIDE'} ±{TOLERANCE:.0%}")
    if args.out:
        record = {"vllm_version": info.version, "server_argv": list(SERVER.vllm_args), "workload": WORKLOAD, "figures": figures, "ratio": ratio, "agree": agree}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
