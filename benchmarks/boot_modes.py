"""What a boot of the tiny model costs on the CPU build, compiled (vLLM's default) against eager.

Each round boots one server of each mode, alternating (A B A B), pinned as a session pins it (the
server on every CPU but the last, the client on the last), and with ``--cold`` in a fresh
``VLLM_CACHE_ROOT`` each time, as a runner's first session of a config boots; without it both modes
share one cache folder, which the first round fills (leave that round out of the warm figures). Per
boot: the seconds until the server answered as ready (``ManagedServer.start``), vLLM's own "init
engine (profile, create kv cache, warmup model) took" from its log, and the output throughput of one
closed-loop load through ``qwenperf bench`` (128 prompts of 128 in / 128 out at concurrency 32 after
32 warm-up requests).

What it shows: how much of a boot torch.compile's warm-up takes and what eager costs in speed. What it
does not: whether eager changes the tokens (the canary answers were recorded compiled), nor any GPU.

    python -m benchmarks.boot_modes --rounds 2 --cold --out boots-cold.json
    python -m benchmarks.boot_modes --rounds 3 --out boots-warm.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec

from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import placement
from pytest_qwenperf.serving.pool import server_spec
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER, ManagedServer
from pytest_qwenperf.suite.config import tiny_cpu_config

SCHEMA = "qwenperf-boot-modes/1"
MODES = {"compiled": (), "eager": ("--enforce-eager",)}
CTX_SHORT = ("--max-model-len", "512", "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--no-enable-prefix-caching")
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


@dataclass(frozen=True)
class Boot:
    round: int
    mode: str
    boot_s: float  # until the server answered as ready
    init_engine_s: float | None  # vLLM's own figure from its log (None: not found)
    output_throughput: float  # tok/s of the load after it


def boot_and_load(round_no: int, mode: str, cache: Path, logs: Path) -> Boot:
    """One boot of ``mode`` with ``cache`` as its VLLM_CACHE_ROOT, then one load; the server is stopped after."""
    config = tiny_cpu_config(f"boot-{mode}", CTX_SHORT + MODES[mode])
    placed = placement(config, detect())
    spec = server_spec(config, launcher=DEFAULT_LAUNCHER, boot_timeout_s=600, cpus=placed.server_cpus, vllm_cache=cache)
    server = ManagedServer(spec, logs)
    started = time.monotonic()
    server.start()
    try:
        boot_s = time.monotonic() - started
        found = INIT.search(server.log_tail(400))
        out = logs / f"{mode}-{time.monotonic_ns()}.json"
        client = ["taskset", "-c", ",".join(map(str, sorted(placed.client_cpus)))] if placed.client_cpus else []
        bench = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", server.base_url, "--input-len", "128"]
        bench += ["--output-len", "128", "--num-prompts", "128", "--warmup", "32", "--max-concurrency", "32", "--json", str(out), "--progress", "off"]
        subprocess.run(client + bench, check=True, capture_output=True, timeout=600)
        metrics = json.loads(out.read_text())["metrics"]
    finally:
        server.stop()
    return Boot(round_no, mode, round(boot_s, 2), float(found.group(1)) if found else None, metrics["output_throughput"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="a fresh compile cache for every boot")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    boots = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for round_no in range(args.rounds):
            for mode in MODES:
                cache = base / (f"cache-{round_no}-{mode}" if args.cold else "cache")
                boots.append(boot_and_load(round_no, mode, cache, base / "logs"))
                print(json.dumps(asdict(boots[-1])), flush=True)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for mode in MODES:
        mine = [b for b in boots if b.mode == mode and (args.cold or b.round > 0)]
        figures = {
            "boot_s": [b.boot_s for b in mine],
            "init_engine_s": [b.init_engine_s for b in mine if b.init_engine_s is not None],
            "output_throughput": [b.output_throughput for b in mine],
        }
        summary[mode] = {key: {"median": statistics.median(v), "min": min(v), "max": max(v)} for key, v in figures.items() if v}
    report = {"schema": SCHEMA, "cold": args.cold, "machine": msgspec.to_builtins(detect().machine()), "boots": [asdict(b) for b in boots], "summary": summary}
    write_atomically(args.out, json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
