"""What does telemetry cost the run it watches?

Boots the server of ``benchmarks/agreement.py`` (the tiny model on the CPU build, prefix
caching off) pinned to the first CPU and drives its workload (random 128/128, 32 in
flight, 256 measured requests after 32 warm-up) from this process pinned to the last CPU, alternating runs with every
sampler on (psutil on the server and client trees, the servers' /metrics gauges, as in
the suite) and with none. The overhead is the difference of the medians of
``output_throughput``; the run-to-run noise is the larger coefficient of variation of the
two arms. Prints a markdown table, writes every figure as JSON with ``--out``, and exits
1 when the difference is not smaller than the noise.

    python -m benchmarks.overhead --rounds 6 --out overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.agreement import SERVER, WORKLOAD, tiny_server
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.measure.observe import ClientSetup, Load, Target, observe
from pytest_qwenperf.suite.embedded import resolve_model
from pytest_qwenperf.suite.workloads import RandomWorkload

ARMS = ("sampling on", "sampling off")


def coefficient_of_variation(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="pairs of runs (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    args = parser.parse_args()
    if args.rounds < 2:
        raise SystemExit("--rounds: at least 2, so that the noise can be measured")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the server, one for the client")
    server_cpus, client_cpus = frozenset(cpus[:-1]), frozenset(cpus[-1:])
    w = WORKLOAD
    workload = RandomWorkload(input_len=w["input_len"], output_len=w["output_len"], num_prompts=w["num_prompts"] + w["warmup"])
    requests = workload.build(PromptTokenizer.load(resolve_model(SERVER.model)))
    figures: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp, tiny_server(server_cpus, Path(tmp)) as server:
        for n in range(args.rounds):
            for arm in ARMS if n % 2 == 0 else ARMS[::-1]:  # alternate which arm goes first
                seen = observe(
                    Target(tuple(server.base_urls), server.model, server_pids=tuple(server.pids)),
                    Load(requests, ClosedLoop(w["concurrency"]), LoadOptions(warmup=w["warmup"])),
                    ClientSetup(cpus=client_cpus, sample=arm == "sampling on"),
                )
                figures[arm].append(float(seen.summary.values()["output_throughput"]))
            print(f"round {n + 1}: " + ", ".join(f"{arm} {figures[arm][-1]:,.0f}" for arm in ARMS), file=sys.stderr)
    medians = {arm: statistics.median(values) for arm, values in figures.items()}
    difference = medians["sampling on"] / medians["sampling off"] - 1
    noise = max(coefficient_of_variation(values) for values in figures.values())
    within = abs(difference) < noise
    print(f"server on CPU {','.join(map(str, sorted(server_cpus)))}, client on CPU {cpus[-1]}\n")
    print("| arm | output tok/s per run | median | coefficient of variation |")
    print("| --- | --- | --- | --- |")
    for arm, values in figures.items():
        print(f"| {arm} | {' / '.join(f'{v:,.0f}' for v in values)} | {medians[arm]:,.0f} | {coefficient_of_variation(values):.1%} |")
    print(f"\nsampling on vs off: {difference:+.1%}; run-to-run noise {noise:.1%}: {'within' if within else 'NOT within'} the noise")
    if args.out:
        record = {"figures": figures, "difference": difference, "noise": noise, "within_noise": within}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
