"""vLLM's scheduler gauges over time, polled from every replica's ``/metrics`` during a run.

Requests running and waiting (summed over engines and replicas) show whether the
server ran at the batch size the workload intended or queued; KV-cache usage (averaged
over engines: each has its own pool) shows whether the cache was the limit. The token
counters are kept too, for the server-side throughput over the same window as the
client's. Scraping costs the server, so the default interval is a second.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from pytest_qwenperf.core.http import http_get
from pytest_qwenperf.telemetry.sampling import (
    CLOCK,
    PeriodicSampler,
    SamplerHealth,
    Stats,
    Window,
    counter_increase,
    inside,
)
from pytest_qwenperf.telemetry.server_metrics import (
    COUNTERS,
    GAUGES,
    page_text,
    series_values,
    snapshot_of,
)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GaugeSample:
    """One poll of every replica; None where the servers do not expose the quantity."""

    at: float  # perf_counter seconds, the middle of the poll
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # mean over engines, fraction of 1
    counters: Mapping[str, float | None]  # canonical counter name → sum over engines and replicas


@dataclass(frozen=True)
class GaugeSummary:
    """The gauges over a window, and each counter's rate over it."""

    samples: int
    running: Stats | None
    waiting: Stats | None
    kv_cache_usage: Stats | None
    rates: Mapping[str, float | None]  # counter → increase per second over the window
    health: SamplerHealth

    def as_json(self) -> dict[str, object]:
        def stats(s: Stats | None) -> dict[str, float | int] | None:
            return s.as_json() if s else None

        return {
            "samples": self.samples,
            "num_requests_running": stats(self.running),
            "num_requests_waiting": stats(self.waiting),
            "kv_cache_usage": stats(self.kv_cache_usage),
            "rates_per_s": dict(self.rates),
            "sampler": self.health.as_json(),
        }


def gauge_sample(at: float, pages: Sequence[str]) -> GaugeSample:
    """One sample from the ``/metrics`` text of every replica."""
    series = [series_values(page) for page in pages]
    snapshots = [snapshot_of(s) for s in series]

    def summed(name: str) -> float | None:
        parts = [snap[name] for snap in snapshots]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    engines = [_engine_values(s, GAUGES["kv_cache_usage"]) for s in series]
    usage = [v for values in engines if values is not None for v in values]
    return GaugeSample(
        at=at,
        running=summed("num_requests_running"),
        waiting=summed("num_requests_waiting"),
        kv_cache_usage=statistics.fmean(usage) if usage and None not in engines else None,
        counters=MappingProxyType({name: summed(name) for name in COUNTERS}),
    )


def _engine_values(series: Mapping[str, Sequence[float]], aliases: Sequence[str]) -> Sequence[float] | None:
    return next((series[name] for name in aliases if series.get(name)), None)


class MetricsPoller(PeriodicSampler):
    """Scrapes ``/metrics`` of every replica each interval; a poll counts only if every replica answered."""

    def __init__(
        self, base_urls: Sequence[str], interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(interval_s)
        self.base_urls = tuple(u.rstrip("/") for u in base_urls)
        self.timeout_s = timeout_s
        self.samples: list[GaugeSample] = []

    def _poll(self) -> None:
        began = CLOCK()
        pages = []
        for url in self.base_urls:
            status, body = http_get(f"{url}/metrics", timeout=self.timeout_s)
            if status != 200:
                self._note_failure(f"{url}/metrics returned HTTP {status}")
                return  # a sum that misses a replica would read as a drop in load
            pages.append(page_text(body))  # not text: MetricsUnreadable, noted as this poll's failure
        self.samples.append(gauge_sample((began + CLOCK()) / 2, pages))

    def summary(self, window: Window | None = None) -> GaugeSummary:
        """Gauge statistics of the polls inside ``window`` (all when None); counter rates over it."""
        samples = [s for s in self.samples if inside(s.at, window)]
        return GaugeSummary(
            samples=len(samples),
            running=Stats.of(s.running for s in samples),
            waiting=Stats.of(s.waiting for s in samples),
            kv_cache_usage=Stats.of(s.kv_cache_usage for s in samples),
            rates=MappingProxyType({name: self._rate(name, window) for name in COUNTERS}),
            health=self.health(),
        )

    def _rate(self, name: str, window: Window | None) -> float | None:
        points = [(s.at, value) for s in self.samples if (value := s.counters[name]) is not None]
        increase = counter_increase(points, window)
        if increase is None:
            return None
        start, end = window if window is not None else (points[0][0], points[-1][0])
        return increase / (end - start) if end > start else None
