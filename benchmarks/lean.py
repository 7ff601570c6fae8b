"""Client CPU per million streamed chunks: our client against ``vllm bench serve``'s.

Each client streams from a local source that sends every chunk as fast as it can
(``tests/stream_source.py``, pinned to the first CPU; one token per chunk, vLLM's chunk
layout, usage at the end) on 4 concurrent streams, in a fresh process pinned to the
last CPU. Ours is :func:`~pytest_qwenperf.loadgen.client.run_load` on its event loop,
as ``qwenperf bench`` runs it; theirs is vLLM's ``async_request_openai_completions`` on
an aiohttp session and asyncio's loop, as ``vllm bench serve`` runs it. The figure is
the process's CPU time over the chunks it actually parsed; start-up is not counted.

Whole command lines are not compared: at this speed ``vllm bench serve`` fails its
streams (its SSE reader strips whitespace at read boundaries and merges or breaks
events: ``completed 0, failed 4`` in a probe here), so it would spend less CPU by
reading less. Its request function still parses what it received; that is counted.

    python -m benchmarks.lean --rounds 3 --out lean.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHUNKS = 400_000  # per measurement, over STREAMS streams
STREAMS = 4
TARGET = 0.5  # our CPU per chunk may be at most this share of theirs
CLIENTS = ("qwenperf", "vllm")


def chunks_per_cpu_second(url: str, model: str, client: str, chunks: int = CHUNKS, streams: int = STREAMS) -> float:
    """Chunks this process parses per CPU-second with ``client``, ``chunks`` in all from ``url``."""
    per_stream = chunks // streams
    if client == "qwenperf":
        from pytest_qwenperf.loadgen.arrivals import ClosedLoop
        from pytest_qwenperf.loadgen.client import LoadOptions, new_event_loop, run_load
        from pytest_qwenperf.loadgen.request import RequestSpec

        specs = [RequestSpec(i, per_stream, prompt=(1, 2, 3)) for i in range(streams)]
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            start = time.process_time()
            # Without per-chunk usage, as vllm bench serve asks: the same bytes for both clients.
            load = runner.run(run_load([url], model, specs, ClosedLoop(streams), LoadOptions(continuous_usage=False)))
            cpu = time.process_time() - start
        if not all(r.ok for r in load.records):
            raise RuntimeError(f"our client failed a stream: {[r.error for r in load.records if not r.ok]}")
        return sum(len(r.chunk_tokens) for r in load.records) / cpu

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    async def theirs() -> tuple[int, float]:
        request = RequestFuncInput(
            prompt=[1, 2, 3], api_url=url + "/v1/completions", prompt_len=3, output_len=per_stream, model=model, ignore_eos=True
        )
        async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=600)) as session:
            start = time.process_time()
            outputs = await asyncio.gather(*(async_request_openai_completions(request, session) for _ in range(streams)))
            cpu = time.process_time() - start
        return sum(len(o.itl) + (o.ttft > 0) for o in outputs), cpu

    parsed, cpu = asyncio.run(theirs())
    return parsed / cpu


def _measure_in_fresh_process(url: str, model: str, client: str, cpu: int) -> float:
    code = f"from benchmarks.lean import chunks_per_cpu_second as f; print(f({url!r}, {model!r}, {client!r}))"
    done = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{client} client failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    from tests.stream_source import MODEL, stream_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the stream source, one for the clients")
    rates: dict[str, list[float]] = {client: [] for client in CLIENTS}
    with stream_source(cpus={cpus[0]}, default_schedule={"fast": True}) as source:
        for n in range(args.rounds):
            for client in CLIENTS:
                rates[client].append(_measure_in_fresh_process(source.urls[0], MODEL, client, cpus[-1]))
            print(f"round {n + 1}: " + ", ".join(f"{c} {rates[c][-1]:,.0f}" for c in CLIENTS) + " chunks per CPU-second", file=sys.stderr)
    cost = {client: 1e6 / statistics.median(values) for client, values in rates.items()}
    ratio = cost["qwenperf"] / cost["vllm"]
    print(f"stream source on CPU {cpus[0]}, clients on CPU {cpus[-1]}; {STREAMS} streams, {CHUNKS:,} chunks per run\n")
    print("| client | chunks per CPU-second, per round | CPU s per million chunks (median) |")
    print("| --- | --- | --- |")
    for client, values in rates.items():
        print(f"| {client} | {' / '.join(f'{v:,.0f}' for v in values)} | {cost[client]:.2f} |")
    print(f"\nours / theirs = {ratio:.2f} (target <= {TARGET})")
    if args.out:
        args.out.write_text(json.dumps({"chunks_per_cpu_s": rates, "cpu_s_per_million": cost, "ratio": ratio}, indent=2) + "\n")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
