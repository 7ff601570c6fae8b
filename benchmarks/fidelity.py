"""How faithfully the client times what a server did, and how closely it keeps an open loop's schedule.

Chunk timing: 768 requests over 256 concurrent streams from a local source
(``tests/stream_source.py``, pinned to the first CPU) with realistic, varied schedules
(TTFT 50-200 ms, gaps 10-20 ms, 32 tokens in chunks of 1-3 like speculative decoding, some
chunks with empty text), so that sends do not line up; the first 256 are held until all of
them are open, so that the client really has 256 streams at once. The client is
:func:`~pytest_qwenperf.loadgen.client.run_load` in this process, pinned to the last CPU.
The reference is what the source logged just before each write (``perf_counter`` is
CLOCK_MONOTONIC, shared by both processes): a chunk's error is how much later the client
timed it than the source sent it, so a late *source* is not counted against the client.
TTFT's error is its first chunk's, ITL's the difference of consecutive gaps; the first
wave of 256 requests starts in one burst, which queues in the (Python) source, so only
the later 512 requests count. Two arms: ``own``, the client's CPU to itself, and
``shared``, a busy loop on the client's CPU, so that the client is descheduled for
milliseconds at a time, as a vCPU on a small VM is. Also reported: the request leg (the
client's write to the source's ``data_received``) and the errors against the nominal
schedules.

Schedule keeping: an open loop of 200 requests at 40 requests/s (constant and Poisson
arrivals) against the same source; the scheduling lag is how late each request was sent.

Targets (judged on the median over rounds): p99 TTFT and ITL error at most 1 ms in both
arms; request leg median under 0.5 ms in ``own``; open-loop scheduling lag p90 under 5 ms.
Exit status 1 when one is missed. Run on an otherwise idle machine: these figures are
about the client, and other load on the machine shows in them.

    python -m benchmarks.fidelity --rounds 3 --out fidelity.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_qwenperf.loadgen.arrivals import ClosedLoop, OpenLoop
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.client import LoadResult, run_load_sync
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.workers import pin_current_process
from tests.processes import busy_loops
from tests.stream_source import MODEL, stream_source

STREAMS = 256
REQUESTS = 3 * STREAMS
TOKENS = 32
TIMING_TARGET_MS = 1.0  # p99 TTFT and ITL error
REQUEST_LEG_TARGET_MS = 0.5  # median, client CPU to itself
LAG_TARGET_MS = 5.0  # p90 open-loop scheduling lag
LAG_RATE, LAG_REQUESTS = 40.0, 200
ARMS = ("own", "shared")


@dataclass(frozen=True)
class StreamsRun:
    """One run of the 256-stream scenario: what the client recorded and what the source logged."""

    load: LoadResult
    schedules: dict[int, dict[str, Any]]  # request index -> the x_schedule it carried
    sent: dict[int, list[float]]  # request index -> [arrived, just before each chunk's write, ...]
    written: dict[int, list[float | None]]  # request index -> [just after each chunk's write (None: it had to wait)]
    stats: dict[str, Any]  # the source's /stats


def cpus() -> tuple[set[int] | None, set[int] | None]:
    """The source's CPU and the client's: the first and the last (None, None: one CPU only, nothing pinned)."""
    available = sorted(os.sched_getaffinity(0))
    return ({available[0]}, {available[-1]}) if len(available) >= 2 else (None, None)


@contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Pin this process (the client) for the duration, then restore its affinity."""
    previous = pin_current_process(cpus) if cpus else None
    try:
        yield
    finally:
        if previous is not None:
            pin_current_process(previous)


def _request(index: int, schedule: dict[str, Any], max_tokens: int = TOKENS) -> RequestSpec:
    """A request whose ``x_schedule`` tells the source how to answer it (logged under its index)."""
    sampling = (("temperature", 0.0), ("x_schedule", {"id": index, **schedule}))
    return RequestSpec(index, max_tokens, prompt=(1, 2, 3), sampling=sampling)


def streams_run(seed: int, competitor: bool) -> StreamsRun:
    """The 256-stream scenario once; ``competitor``: a busy loop shares the client's CPU meanwhile."""
    rng = random.Random(seed)
    specs, schedules = [], {}
    for i in range(REQUESTS):
        per_chunk: list[int] = []
        while sum(per_chunk) < TOKENS:
            per_chunk.append(min(rng.choice((1, 1, 1, 2, 3)), TOKENS - sum(per_chunk)))
        gaps = [0.0] + [rng.uniform(10, 20) for _ in per_chunk[1:]]
        empty = [k for k in range(len(per_chunk)) if rng.random() < 0.1]
        schedules[i] = {"ttft_ms": rng.uniform(50, 200), "itl_ms": gaps, "tokens_per_chunk": per_chunk, "empty_text": empty}
        if i < STREAMS:
            schedules[i]["hold_until"] = STREAMS  # the first wave starts once all 256 streams are open, however slow the client
        specs.append(_request(i, schedules[i]))
    source_cpus, client_cpus = cpus()
    with stream_source(cpus=source_cpus) as src, pinned(client_cpus):
        with busy_loops(frozenset(client_cpus or sorted(os.sched_getaffinity(0))[:1])) if competitor else nullcontext():
            load = run_load_sync(src.urls, MODEL, specs, ClosedLoop(STREAMS), LoadOptions(continuous_usage=True))
        return StreamsRun(load, schedules, src.sent(), src.written(), src.stats())


def timing_errors(run: StreamsRun) -> dict[str, float]:
    """p99 absolute errors (ms) of the client's TTFT and ITL against the source's sends and the nominal schedules."""
    names = ("ttft", "itl", "ttft vs schedule", "itl vs schedule", "request leg")
    errors: dict[str, list[float]] = {name: [] for name in names}
    for r in run.load.records:
        if r.index < STREAMS or not r.ok:
            continue  # the first wave starts in one burst, which queues in the (Python) source, not in the client
        schedule, actual, times = run.schedules[r.index], np.array(run.sent[r.index]), np.array(r.chunk_times)
        errors["ttft"].append(times[0] - actual[1])
        errors["itl"].extend(np.diff(times) - np.diff(actual[1:]))
        errors["request leg"].append(actual[0] - r.sent_at)
        errors["ttft vs schedule"].append((times[0] - r.sent_at) - schedule["ttft_ms"] / 1e3)
        errors["itl vs schedule"].extend(np.diff(times) - np.array(schedule["itl_ms"][1:]) / 1e3)
    result = {name: float(np.percentile(np.abs(values), 99) * 1e3) for name, values in errors.items()}
    result["request leg p50"] = float(np.median(errors["request leg"]) * 1e3)
    result["source late"] = run.stats["late_ms_p99"]
    result["failed"] = sum(not r.ok for r in run.load.records)
    return result


def scheduling_lag_ms(distribution: str, seed: int) -> dict[str, float]:
    """Scheduling lag percentiles (ms) of an open loop at ``LAG_RATE`` requests/s, the client pinned as above."""
    source_cpus, client_cpus = cpus()
    arrival = OpenLoop(rate=LAG_RATE, distribution=distribution, seed=seed)
    specs = [_request(i, {"itl_ms": 5}, max_tokens=2) for i in range(LAG_REQUESTS)]
    with stream_source(cpus=source_cpus) as src, pinned(client_cpus):
        load = run_load_sync(src.urls, MODEL, specs, arrival, LoadOptions(continuous_usage=True))
    lag = np.array([r.scheduling_lag for r in load.records]) * 1e3
    return {f"p{p}": float(np.percentile(lag, p)) for p in (50, 90, 99)} | {"max": float(lag.max())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each arm and distribution (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write all figures here as JSON")
    args = parser.parse_args()
    timing: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    lags: dict[str, list[dict[str, float]]] = {"constant": [], "poisson": []}
    for n in range(args.rounds):
        for arm, rows in timing.items():
            rows.append(timing_errors(streams_run(n, competitor=arm == "shared")))
            print(f"round {n + 1}, {arm}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items()), file=sys.stderr)
        for distribution, rows in lags.items():
            rows.append(scheduling_lag_ms(distribution, seed=n + 1))
            print(f"round {n + 1}, {distribution}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items()), file=sys.stderr)

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    source_cpus, client_cpus = cpus()
    print(f"stream source on CPUs {source_cpus}, client on CPUs {client_cpus}; {REQUESTS} requests over {STREAMS} streams\n")
    print("| arm | p99 TTFT error (ms), per round | p99 ITL error (ms), per round | request leg p50 (ms) | source late p99 (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for arm, rows in timing.items():
        cells = [" / ".join(f"{row[key]:.3f}" for row in rows) for key in ("ttft", "itl", "request leg p50", "source late")]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    print(f"\nOpen loop, {LAG_REQUESTS} requests at {LAG_RATE:.0f}/s:\n")
    print("| arrivals | scheduling lag p50 (ms) | p90 (ms), per round | p99 (ms) | max (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for distribution, rows in lags.items():
        cells = [f"{median(rows, 'p50'):.3f}", " / ".join(f"{row['p90']:.3f}" for row in rows)]
        cells += [f"{median(rows, 'p99'):.3f}", f"{max(row['max'] for row in rows):.3f}"]
        print(f"| {distribution} | " + " | ".join(cells) + " |")

    missed = [
        f"{arm} p99 {key} error {median(rows, key):.3f} ms > {TIMING_TARGET_MS} ms"
        for arm, rows in timing.items()
        for key in ("ttft", "itl")
        if median(rows, key) > TIMING_TARGET_MS
    ]
    if median(timing["own"], "request leg p50") >= REQUEST_LEG_TARGET_MS:
        missed.append(f"own request leg p50 {median(timing['own'], 'request leg p50'):.3f} ms >= {REQUEST_LEG_TARGET_MS} ms")
    missed += [
        f"{distribution} scheduling lag p90 {median(rows, 'p90'):.3f} ms >= {LAG_TARGET_MS} ms"
        for distribution, rows in lags.items()
        if median(rows, "p90") >= LAG_TARGET_MS
    ]
    missed += [f"{arm}: {int(row['failed'])} requests failed" for arm, rows in timing.items() for row in rows if row["failed"]]
    print("\n" + ("missed: " + "; ".join(missed) if missed else "all targets met (medians over rounds)"))
    if args.out:
        args.out.write_text(json.dumps({"timing_ms": timing, "scheduling_lag_ms": lags, "missed": missed}, indent=2) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
