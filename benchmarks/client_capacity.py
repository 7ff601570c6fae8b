"""Client cores per throughput target: output tokens one client process drives per CPU-second.

A local source (``tests/stream_source.py``, pinned to the first CPU) imitates vLLM's
streaming completions; the client is :func:`~pytest_qwenperf.loadgen.client.run_load`
exactly as the suite drives it (``LoadOptions()`` defaults: usage in every chunk), in a
fresh process pinned to the last CPU. The workload is the write-up's shape: prompts of
1024 token ids (sent as ids, so each request body is a realistic ~7 KB), 512 output
tokens per request, ``ignore_eos``, a closed loop of 256 streams. Each variant is timed
by the client process's CPU time (``getrusage``; the workers' too, where there are
workers), not wall time, so other load on the machine matters little:

- ``requests``: 1 output token per request, so the run is all per-request cost (JSON body,
  connection reuse, headers, the first chunk's JSON decode, the record).
- ``fast-1`` / ``fast-2``: the source sends each response as fast as it can (one token
  per chunk, or two, as MTP-1 with high acceptance streams). The client is the
  bottleneck, but it reads hundreds of chunks per ``recv``: a lower bound on the cost.
- ``paced-1`` / ``paced-2``: every chunk 20 ms after the previous one on each stream, so
  each chunk is its own TCP segment and its own read, as from a real server (vLLM writes
  one SSE event per engine step; at the write-up's load, 4096 streams per node, a stream
  gets a chunk every ~130 ms). The client is then not saturated (about a quarter of its
  core busy); this is the figure to size client cores by.
- ``workers-1`` / ``workers-2``: ``paced-1`` through
  :func:`~pytest_qwenperf.loadgen.workers.run_load_in_workers` with one and two worker
  processes on the same CPU; the parent's CPU (start-up, receiving and merging records)
  and the workers' are both counted. Each worker process's own start-up (spawn, imports:
  ~0.2-0.25 s of CPU each) is measured by three tiny runs just before and their median
  subtracted. Equal CPU per token for 1 and 2 workers means that workers multiply the
  per-process figure.
- ``paced-1-half``: ``paced-1`` with 128 streams in one process, what each of the two
  workers drives: it tells a cost of splitting the streams (fewer events per wake-up of
  each event loop) from a cost of two processes taking turns on one core.

Per run: client CPU seconds, requests, output tokens (from usage), chunks, reads that
carried tokens (distinct arrival stamps per request), and the no-loss check (every
request ok, usage output = requests x 512, per-chunk tokens summing to the usage). From
the medians: output tokens and requests per client CPU-second, the CPU per request and
per chunk, and the client cores the write-up's targets need at a 50 % utilization cap per
core.

    python -m benchmarks.client_capacity --rounds 3 --out capacity.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

ISL, OSL = 1024, 512
CONCURRENCY = 256
VOCAB = 151_643  # Qwen's regular (non-special) token ids: prompt ids are drawn below this
PROMPTS = 256  # distinct prompts, cycled over the requests
ITL_MS = 20.0  # paced variants: gap between two chunks of a stream
HEADROOM = 0.5  # size for at most this share of each client core busy
STARTUP_PROBES = 3  # tiny worker runs whose median start-up CPU is subtracted from a worker run


class Variant(NamedTuple):
    schedule: dict[str, Any]  # the source's schedule for every request
    requests: int  # per run
    max_tokens: int = OSL
    workers: int = 0  # worker processes; 0: run_load in the measuring process
    concurrency: int = CONCURRENCY


PACED = {"itl_ms": ITL_MS}
TWO_PER_CHUNK = {"tokens_per_chunk": [2] * (OSL // 2)}
VARIANTS = {
    "requests": Variant({"fast": True}, 4096, max_tokens=1),
    "fast-1": Variant({"fast": True}, 2048),
    "fast-2": Variant({"fast": True, **TWO_PER_CHUNK}, 2048),
    "paced-1": Variant(PACED, 512),
    "paced-2": Variant({**PACED, **TWO_PER_CHUNK}, 512),
    "workers-1": Variant(PACED, 512, workers=1),
    "workers-2": Variant(PACED, 512, workers=2),
    "paced-1-half": Variant(PACED, 256, concurrency=CONCURRENCY // 2),  # what each of two workers drives, alone
}
# Targets in total (input + output) tokens per second; with ISL 1024 / OSL 512 output is a third.
TARGETS = {
    "CPU suite here (isl128-osl128, tiny model)": None,  # its own shape, costed per request and per chunk in targets()
    "one B200 node of the write-up (8 GPUs)": 95_000,
    "12 nodes, 96 B200 (the write-up's 1.1M tok/s)": 1_100_000,
}
CPU_SUITE_OUTPUT_TOK_S, CPU_SUITE_ISL, CPU_SUITE_OSL = 2_126, 128, 128  # CPU suite, base, isl128-osl128: measured here 2026-11-21


def _specs(n: int, max_tokens: int = OSL) -> list[Any]:
    from pytest_qwenperf.loadgen.request import RequestSpec

    rng = random.Random(0)
    prompts = [tuple(rng.randrange(VOCAB) for _ in range(ISL)) for _ in range(min(n, PROMPTS))]
    return [RequestSpec(i, max_tokens, prompt=prompts[i % len(prompts)], expected_prompt_tokens=ISL) for i in range(n)]


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measure(
    url: str, model: str, requests: int, workers: int = 0, max_tokens: int = OSL, concurrency: int = CONCURRENCY
) -> dict[str, Any]:
    """Drive ``requests`` requests of the write-up's shape (``max_tokens`` output tokens each,
    ``concurrency`` in flight) from ``url`` in this process (``workers`` 0) or in worker
    processes; what it cost and what arrived."""
    from pytest_qwenperf.loadgen.arrivals import ClosedLoop
    from pytest_qwenperf.loadgen.assignment import LoadOptions
    from pytest_qwenperf.loadgen.client import run_load_sync
    from pytest_qwenperf.loadgen.workers import run_load_in_workers

    specs = _specs(requests, max_tokens)
    startups = []
    for _ in range(STARTUP_PROBES if workers else 0):  # what starting the workers costs (spawn, imports, a 1-token request each)
        before = _cpu_s(resource.RUSAGE_CHILDREN)
        run_load_in_workers(workers, [url], model, _specs(workers, 1), ClosedLoop(workers), LoadOptions())
        startups.append(_cpu_s(resource.RUSAGE_CHILDREN) - before)
    startup_s = statistics.median(startups) if startups else 0.0
    self0, children0, wall0 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN), time.perf_counter()
    if workers:
        load = run_load_in_workers(workers, [url], model, specs, ClosedLoop(concurrency), LoadOptions())
    else:
        load = run_load_sync([url], model, specs, ClosedLoop(concurrency), LoadOptions())
    wall = time.perf_counter() - wall0
    parent = _cpu_s(resource.RUSAGE_SELF) - self0
    children = _cpu_s(resource.RUSAGE_CHILDREN) - children0 - startup_s
    records = load.records
    body_bytes = statistics.fmean(len(json.dumps(s.body(model, continuous_usage=True))) for s in specs[:PROMPTS])
    return {
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "workers": workers,
        "requests": len(records),
        "ok": sum(r.ok for r in records),
        "errors": sorted({r.error for r in records if r.error})[:3],
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "output_tokens": sum(r.completion_tokens for r in records),
        "chunk_tokens": sum(sum(r.chunk_tokens) for r in records),
        "chunks": sum(len(r.chunk_tokens) for r in records),
        "reads": sum(len(set(r.chunk_times)) for r in records),
        "cpu_s": parent + children,
        "parent_cpu_s": parent,
        "workers_cpu_s": children,
        "workers_startup_cpu_s": startup_s,
        "workers_startup_probes_cpu_s": startups,
        "wall_s": wall,
        "request_body_bytes": body_bytes,
    }


def _measure_in_fresh_process(url: str, model: str, v: Variant, requests: int, cpu: int) -> dict[str, Any]:
    args = f"{url!r}, {model!r}, {requests}, {v.workers}, {v.max_tokens}, {v.concurrency}"
    code = f"import json; from benchmarks.client_capacity import measure as m; print(json.dumps(m({args})))"
    done = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"client failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _source_cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def derive(run: dict[str, Any]) -> dict[str, Any]:
    """Per-run rates and the no-loss check."""
    cpu = run["cpu_s"]
    expected = run["requests"] * run["max_tokens"]
    lossless = run["ok"] == run["requests"] and run["output_tokens"] == expected == run["chunk_tokens"]
    return {
        **run,
        "output_tok_per_cpu_s": run["output_tokens"] / cpu,
        "requests_per_cpu_s": run["requests"] / cpu,
        "us_per_chunk": cpu / run["chunks"] * 1e6,
        "chunks_per_read": run["chunks"] / run["reads"],
        "client_busy": cpu / run["wall_s"],
        "lossless": lossless,
    }


def cost_model(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """CPU per request (the 1-token variant: body, connection, headers, record), and per chunk
    for each streaming variant once its requests' share is taken off (medians, microseconds)."""
    per_request = statistics.median(r["cpu_s"] / r["requests"] for r in runs["requests"])
    model = {"us_per_request": per_request * 1e6}
    for variant in ("fast-1", "fast-2", "paced-1", "paced-2"):
        net = [(r["cpu_s"] - per_request * r["requests"]) / r["chunks"] for r in runs[variant]]
        model[f"us_per_chunk_{variant}"] = statistics.median(net) * 1e6
    return model


def cores(output_tok_s: float, per_core_output_tok_s: float) -> dict[str, float]:
    busy = output_tok_s / per_core_output_tok_s
    return {"busy_cores": busy, "cores_at_headroom": busy / HEADROOM, "workers": max(1, math.ceil(busy / HEADROOM))}


def targets(medians: dict[str, float], model: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, total in TARGETS.items():
        if total is None:  # the CPU suite's own shape, 128 in / 128 out: from the per-request and per-chunk costs
            req_s = CPU_SUITE_OUTPUT_TOK_S / CPU_SUITE_OSL
            row = {"total_tok_s": CPU_SUITE_OUTPUT_TOK_S * (CPU_SUITE_ISL + CPU_SUITE_OSL) / CPU_SUITE_OSL, "output_tok_s": CPU_SUITE_OUTPUT_TOK_S}
            for variant in ("paced-1", "fast-1"):
                busy = (req_s * model["us_per_request"] + CPU_SUITE_OUTPUT_TOK_S * model[f"us_per_chunk_{variant}"]) / 1e6
                row[variant] = {"busy_cores": busy, "cores_at_headroom": busy / HEADROOM, "workers": max(1, math.ceil(busy / HEADROOM))}
        else:
            output = total * OSL / (ISL + OSL)
            row = {"total_tok_s": total, "output_tok_s": output}
            for variant in ("paced-1", "paced-2", "fast-1", "fast-2"):
                row[variant] = cores(output, medians[variant])
        out[name] = row
    return out


def main() -> int:
    from tests.stream_source import MODEL, stream_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every run's requests (a quick check: 0.05)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two CPUs: one for the stream source, one for the client")
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    started = time.perf_counter()
    with ExitStack() as stack:
        sources = {
            variant: stack.enter_context(stream_source(cpus={cpus[0]}, default_schedule=schedule))
            for variant, (schedule, *_) in VARIANTS.items()
        }
        for n in range(args.rounds):
            for variant, v in VARIANTS.items():
                source = sources[variant]
                source.reset()
                source_cpu = _source_cpu_s(source.proc.pid)
                run = _measure_in_fresh_process(source.urls[0], MODEL, v, max(2, round(v.requests * args.scale)), cpus[-1])
                run["source_cpu_s"] = _source_cpu_s(source.proc.pid) - source_cpu
                stats = source.stats()
                run["source_late_ms_p99"], run["source_late_ms_max"] = stats["late_ms_p99"], stats["late_ms_max"]
                runs[variant].append(derive(run))
                r = runs[variant][-1]
                print(
                    f"round {n + 1} {variant}: {r['output_tok_per_cpu_s']:,.0f} output tok per client CPU-s, "
                    f"{r['us_per_chunk']:.1f} us/chunk, {r['chunks_per_read']:.1f} chunks/read, client busy {r['client_busy']:.0%}, "
                    f"source busy {r['source_cpu_s'] / r['wall_s']:.0%}, lossless {r['lossless']}",
                    file=sys.stderr,
                )
    elapsed = time.perf_counter() - started
    medians = {variant: statistics.median(r["output_tok_per_cpu_s"] for r in rs) for variant, rs in runs.items()}
    req_medians = {variant: statistics.median(r["requests_per_cpu_s"] for r in rs) for variant, rs in runs.items()}
    model = cost_model(runs)
    table = targets(medians, model)
    lossless = all(r["lossless"] for rs in runs.values() for r in rs)
    ratio_workers = medians["workers-2"] / medians["workers-1"]
    ratio_half = medians["paced-1-half"] / medians["paced-1"]

    print(f"source on CPU {cpus[0]}, client on CPU {cpus[-1]}; ISL {ISL} (token ids), OSL {OSL}, closed loop {CONCURRENCY} (paced-1-half {CONCURRENCY // 2}); {elapsed:.0f} s\n")
    print("| variant | round | requests | output tokens | chunks | chunks/read | client CPU s | client busy | output tok per CPU-s | requests per CPU-s | us per chunk | lossless |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for variant, rs in runs.items():
        for k, r in enumerate(rs, 1):
            print(
                f"| {variant} | {k} | {r['requests']:,} | {r['output_tokens']:,} | {r['chunks']:,} | {r['chunks_per_read']:.1f} | "
                f"{r['cpu_s']:.2f} | {r['client_busy']:.0%} | {r['output_tok_per_cpu_s']:,.0f} | {r['requests_per_cpu_s']:,.1f} | "
                f"{r['us_per_chunk']:.2f} | {'yes' if r['lossless'] else 'NO'} |"
            )
    print("\n| variant | median output tok per client CPU-s | median requests per client CPU-s |")
    print("| --- | --- | --- |")
    for variant in runs:
        print(f"| {variant} | {medians[variant]:,.0f} | {req_medians[variant]:,.1f} |")
    print(f"\nCPU per request {model['us_per_request']:.0f} us; per chunk, besides: " + ", ".join(
        f"{variant} {model[f'us_per_chunk_{variant}']:.2f} us" for variant in ("fast-1", "fast-2", "paced-1", "paced-2")
    ))
    print(f"\nworkers-2 / workers-1 output tok per CPU-s: {ratio_workers:.3f}; paced-1-half / paced-1: {ratio_half:.3f}")
    print(f"every run lossless: {lossless}\n")
    print(f"| target | total tok/s | output tok/s | client cores at {HEADROOM:.0%} busy (paced, 1 tok/chunk) | (paced, 2 tok/chunk) | (fast, 1 tok/chunk: lower bound) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in table.items():
        cells = [f"{row[v]['cores_at_headroom']:.2f}" if v in row else "n/a" for v in ("paced-1", "paced-2", "fast-1")]
        print(f"| {name} | {row['total_tok_s']:,.0f} | {row['output_tok_s']:,.0f} | " + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "shape": {"isl": ISL, "osl": OSL, "concurrency": CONCURRENCY, "itl_ms_paced": ITL_MS, "headroom": HEADROOM},
                    "cpus": {"source": cpus[0], "client": cpus[-1]},
                    "elapsed_s": elapsed,
                    "runs": runs,
                    "median_output_tok_per_cpu_s": medians,
                    "median_requests_per_cpu_s": req_medians,
                    "cost_model": model,
                    "workers_2_over_1": ratio_workers,
                    "half_over_full": ratio_half,
                    "lossless": lossless,
                    "targets": table,
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
