"""Client CPU per million streamed chunks: ``qwenperf bench`` against ``vllm bench serve``.

Both tools run as the user runs them (whole processes, pinned to the last CPU) against a
local stream source that sends every chunk as fast as it can (``tests/stream_source.py``,
pinned to the first CPU; one token per chunk, usage at the end, vLLM's chunk layout).
Start-up, imports and each tool's initial test request cost the same at any run
length, so each tool runs at two lengths and the cost is the difference:

    CPU s per million chunks = (CPU(long) - CPU(short)) / (chunks(long) - chunks(short)) * 1e6

CPU is user + system time of the tool's process and its children (``RUSAGE_CHILDREN``).
Pairs are interleaved over rounds; the medians are compared.

    python -m benchmarks.lean --rounds 3 --out lean.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from pytest_qwenperf.embedded import resolve_model
from tests.stream_source import MODEL, stream_source

HERE = Path(__file__).resolve().parent
STREAMS = 4
LENGTHS = (20_000, 100_000)  # output tokens (= chunks) per stream, short and long run
TARGET = 0.5  # ours may cost at most this share of theirs


def command(tool: str, url: str, output_len: int) -> list[str]:
    tokenizer = resolve_model("embedded:tiny")
    if tool == "qwenperf bench":
        argv = [sys.executable, "-m", "pytest_qwenperf.cli", "bench", "--endpoint", url, "--model", MODEL, "--progress", "off"]
        argv += ["--tokenizer", tokenizer, "--input-len", "16", "--output-len", str(output_len)]
    else:
        argv = [sys.executable, str(HERE / "vllm_bench_serve.py"), "--base-url", url, "--model", MODEL, "--disable-tqdm"]
        argv += ["--tokenizer", tokenizer, "--dataset-name", "random", "--ignore-eos"]
        argv += ["--random-input-len", "16", "--random-output-len", str(output_len)]
    return argv + ["--num-prompts", str(STREAMS), "--max-concurrency", str(STREAMS)]


def cpu_seconds(argv: list[str], cpu: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(["taskset", "-c", str(cpu), *argv], capture_output=True, text=True, env={**os.environ, "CI": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:5])} ... failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the stream source, one for the clients")
    tools = ("qwenperf bench", "vllm bench serve")
    costs: dict[str, list[float]] = {tool: [] for tool in tools}
    extra_chunks = STREAMS * (LENGTHS[1] - LENGTHS[0])
    with stream_source(cpus={cpus[0]}, default_schedule={"fast": True}) as source:
        for n in range(args.rounds):
            for tool in tools:
                short, long = (cpu_seconds(command(tool, source.urls[0], length), cpus[-1]) for length in LENGTHS)
                costs[tool].append((long - short) / extra_chunks * 1e6)
            print(f"round {n + 1}: " + ", ".join(f"{t} {costs[t][-1]:.2f}" for t in tools) + " CPU s per million chunks", file=sys.stderr)
    medians = {tool: statistics.median(values) for tool, values in costs.items()}
    ratio = medians["qwenperf bench"] / medians["vllm bench serve"]
    print(f"stream source on CPU {cpus[0]}, clients on CPU {cpus[-1]}; {STREAMS} streams of {LENGTHS[0]:,} vs {LENGTHS[1]:,} chunks\n")
    print("| tool | CPU s per million chunks, per round | median | chunks per CPU-second |")
    print("| --- | --- | --- | --- |")
    for tool, values in costs.items():
        print(f"| `{tool}` | {' / '.join(f'{v:.2f}' for v in values)} | {medians[tool]:.2f} | {1e6 / medians[tool]:,.0f} |")
    print(f"\nours / theirs = {ratio:.2f} (target <= {TARGET})")
    if args.out:
        args.out.write_text(json.dumps({"costs": costs, "medians": medians, "ratio": ratio, "lengths": LENGTHS, "streams": STREAMS}, indent=2) + "\n")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
