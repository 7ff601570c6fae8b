"""What ``qwenperf bench`` prints: the summary in ``vllm bench serve``'s layout, and the progress line."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from pytest_qwenperf.core.bench import BenchResult
from pytest_qwenperf.core.records import RequestRecord

_SHOWN_REASONS = 10  # failure reasons printed; the JSON has them all


def print_summary(result: BenchResult, out: TextIO) -> None:
    metrics, identity = result.metrics, result.identity
    print(f"{'=' * 20} qwenperf bench: {identity.workload} on {identity.model} {'=' * 20}", file=out)
    rows = [
        ("Successful requests", "completed", "{:d}"),
        ("Failed requests", "failed", "{:d}"),
        ("Benchmark duration (s)", "duration", "{:.2f}"),
        ("Total input tokens", "total_input_tokens", "{:d}"),
        ("Total generated tokens", "total_output_tokens", "{:d}"),
        ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
        ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
        ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
        ("Total token throughput (tok/s)", "total_token_throughput", "{:.2f}"),
    ]
    for family, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency")):
        rows += [(f"{stat.capitalize()} {title} (ms)", f"{stat}_{family}_ms", "{:.2f}") for stat in ("mean", "median", "p90", "p99")]
    for label, key, fmt in rows:
        if key in metrics and metrics[key] is not None:
            print(f"{label:<40}{fmt.format(metrics[key]):>14}", file=out)
    print(f"{'Token totals vs /metrics':<40}{result.token_check.detail}", file=out)
    if result.trace is not None:
        print(f"{'Trace replay':<40}{result.trace.describe(result)}", file=out)
    for server in result.context.servers:
        for name, why in server["unreadable"].items():
            print(f"UNREADABLE {name} of {server['base_url']}: {why}", file=out)
    if result.client.bound:
        print(f"CLIENT-BOUND (not a server figure): {result.client.bound}", file=out)
    for loss in result.conditions:
        print(f"INVALID {loss.reason} (not a server figure): {loss.detail}", file=out)
    reasons = result.failures.reasons
    if reasons:
        print("Failed requests by reason:", file=out)
        for reason in reasons[:_SHOWN_REASONS]:
            print(f"{reason.count:>8}  {reason.kind:<22}  {reason.message}", file=out)
        if len(reasons) > _SHOWN_REASONS:
            rest = reasons[_SHOWN_REASONS:]
            print(f"{sum(r.count for r in rest):>8}  ({len(rest)} more reasons, all in --json)", file=out)


class ProgressBar:
    """Counts finished requests (what an interrupted run reports) and, given ``out`` (a terminal),
    draws them as one self-overwriting line: requests done, failures, elapsed time."""

    def __init__(self, total: int, out: TextIO | None) -> None:
        self.total, self.out, self.done, self.failed = total, out, 0, 0
        self.started = self.last = time.monotonic()

    def __call__(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += not record.ok
        if self.out is None:
            return
        now = time.monotonic()
        if now - self.last >= 0.2 or self.done == self.total:
            self.last = now
            filled = 30 * self.done // max(self.total, 1)
            self.out.write(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} requests"
                f"{f', {self.failed} failed' if self.failed else ''}, {now - self.started:.0f} s"
            )
            self.out.flush()

    def close(self) -> None:
        if self.out is not None:
            self.out.write("\n")
            self.out.flush()


def show_progress(mode: str) -> bool:
    if mode != "auto":
        return mode == "on"
    return sys.stderr.isatty() and not os.environ.get("CI")
