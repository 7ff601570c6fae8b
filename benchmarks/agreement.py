"""Does ``qwenperf bench`` read the same throughput as ``vllm bench serve``?

Boots the CPU build of vLLM on the tiny model, pinned to the first CPU, and runs both
tools in turn on the last CPU with the same workload: random prompts of 128 tokens,
128 output tokens with ``ignore_eos``, 32 requests in flight, 256 measured requests after
32 warm-up requests, greedy sampling, prefix caching off. Runs are interleaved ABBA (ours, theirs, theirs, ours, ...) so
that drift of the machine hits both alike; the verdict compares the medians of
``output_throughput``. Prints a markdown table and writes every figure as JSON.

**The same prompts.** What is compared is the instruments, so both send the same prompts: vLLM's
random dataset (its ``RandomDataset``, seed 0, as ``vllm bench serve`` draws them), written as a
JSON-lines file that ``qwenperf bench`` reads (``--dataset-name jsonl``). The two tools' own random
prompts differ (ours are token ids drawn independently, theirs text decoded from a run of ids), and
on the tiny model the server's speed depends on them by a few percent: ``--own-prompts`` compares
each tool on its own random prompts instead.

    python -m benchmarks.agreement --rounds 8 --out agreement.json
    python -m benchmarks.agreement --rounds 8 --own-prompts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
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


def ours(url: str, client_cpu: int, out: Path, prompts: Path | None = None) -> float:
    """``qwenperf bench``'s output tok/s; ``prompts``: a JSON-lines file to send instead of its own random prompts."""
    argv = qwenperf_bench(_requests(url), out)
    if prompts is not None:
        at = argv.index("--input-len")
        argv[at : at + 2] = ["--dataset-name", "jsonl", "--dataset-path", str(prompts)]
    _run(["taskset", "-c", str(client_cpu), *argv])
    return float(json.loads(out.read_text())["metrics"]["output_throughput"])


def vllm_prompts(path: Path) -> Path:
    """vLLM's random prompts for :data:`WORKLOAD` (its ``RandomDataset``, seed 0, the tiny model's
    tokenizer), warm-up ones first, written to ``path`` as ``qwenperf bench``'s JSON lines."""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import RandomDataset

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("embedded:tiny"))
    count = WORKLOAD["num_prompts"] + WORKLOAD["warmup"]
    drawn = RandomDataset(random_seed=0).sample(tokenizer, count, input_len=WORKLOAD["input_len"], output_len=WORKLOAD["output_len"])
    path.write_text("".join(json.dumps({"prompt": r.prompt, "output_len": WORKLOAD["output_len"]}) + "\n" for r in drawn))
    return path


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
    parser.add_argument("--own-prompts", action="store_true", help="each tool sends its own random prompts (default: vLLM's, to both)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the server, one for the clients")
    server_cpus, client_cpu = frozenset(cpus[:-1]), cpus[-1]
    figures: dict[str, list[float]] = {"qwenperf bench": [], "vllm bench serve": []}
    with tempfile.TemporaryDirectory() as tmp, tiny_server(server_cpus, Path(tmp)) as server:
        info = server.info[0]
        prompts = None if args.own_prompts else vllm_prompts(Path(tmp) / "vllm-random-prompts.jsonl")
        tools = {"qwenperf bench": partial(ours, prompts=prompts), "vllm bench serve": theirs}
        for n in range(args.rounds):
            for tool in turns(list(tools), n):
                figures[tool].append(tools[tool](server.base_url, client_cpu, Path(tmp) / f"{tool.split()[0]}-{n}.json"))
            print(f"round {n + 1}: ours {figures['qwenperf bench'][-1]:,.0f}, theirs {figures['vllm bench serve'][-1]:,.0f} output tok/s", file=sys.stderr)
    medians = {tool: statistics.median(values) for tool, values in figures.items()}
    ratio = medians["qwenperf bench"] / medians["vllm bench serve"]
    agree = abs(ratio - 1) <= TOLERANCE
    sent = "each tool its own random prompts" if args.own_prompts else "both vLLM's random prompts (seed 0)"
    print(f"vLLM {info.version}, server on CPU {','.join(map(str, sorted(server_cpus)))}, clients on CPU {client_cpu}; {sent}\n")
    print("| tool | output tok/s per run | median |")
    print("| --- | --- | --- |")
    for tool, values in figures.items():
        print(f"| `{tool}` | {' / '.join(f'{v:,.0f}' for v in values)} | {medians[tool]:,.0f} |")
    print(f"\nratio of medians {ratio:.3f}: {'within' if agree else 'OUTSIDE'} ±{TOLERANCE:.0%}")
    if args.out:
        record = {"vllm_version": info.version, "server_argv": list(SERVER.vllm_args), "workload": WORKLOAD, "prompts": "own" if args.own_prompts else "vllm-random-seed-0"}
        record |= {"figures": figures, "ratio": ratio, "agree": agree}
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
