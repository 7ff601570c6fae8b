"""One load run against some endpoints, and everything it saw: the client's records, the servers'
``/metrics`` deltas and the telemetry sampled meanwhile, before any of it is tied to a serving config.

``qwenperf bench`` observes endpoints it was given; :mod:`pytest_qwenperf.measure.run` observes
the servers of a config and makes a run of what it saw.
"""

from __future__ import annotations

import datetime
import os
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from pytest_qwenperf.core.run import PROMPT_LENGTHS, WINDOW_SHORT, Loss
from pytest_qwenperf.core.summary import (
    LAG_P99_LIMIT_S,
    GoodputSLO,
    RunSummary,
    TokenCrossCheck,
    client_bound_reason,
    cross_check,
    prompt_lengths_off,
    steady_window,
    summarize,
)
from pytest_qwenperf.core.timeline import Timeline
from pytest_qwenperf.loadgen.arrivals import Arrival, Replay
from pytest_qwenperf.loadgen.assignment import Assignment, LoadOptions
from pytest_qwenperf.loadgen.client import LoadResult, run_load_sync
from pytest_qwenperf.loadgen.ray_workers import run_load_on_ray
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.requester import Progress, Stop
from pytest_qwenperf.loadgen.workers import pin_current_process, run_load_in_workers
from pytest_qwenperf.measure.timeline import timeline
from pytest_qwenperf.telemetry import Telemetry, TelemetrySummary
from pytest_qwenperf.telemetry.server_metrics import (
    COUNTERS,
    MetricsSnapshot,
    MetricsUnreadable,
    combine,
    counter_deltas,
    scrape_each,
)


@dataclass(frozen=True)
class Target:
    """Where a load run's requests go, and what is watched while it runs."""

    base_urls: tuple[str, ...]
    model: str
    metrics_urls: tuple[str, ...] | None = None  # the servers whose /metrics to read behind a router; None: base_urls
    server_pids: tuple[int, ...] = ()  # whose CPU to sample
    gpu_visible_devices: tuple[str | None, ...] = ()  # which GPUs to sample (each a CUDA_VISIBLE_DEVICES; None: all)


@dataclass(frozen=True)
class Load:
    """What a load run sends: the requests, when they arrive, the client's options and the SLO of goodput."""

    requests: Sequence[RequestSpec]
    arrival: Arrival
    options: LoadOptions = LoadOptions()
    slo: GoodputSLO | None = None


@dataclass(frozen=True)
class ClientSetup:
    """Where the load generator runs: its cores (pinned while the load runs, the affinity restored
    after; empty: not pinned), its processes, whether telemetry is sampled at all
    (``sample=False`` is what ``benchmarks/overhead.py`` compares against), and the Ray cluster
    whose nodes run the processes instead (``ray``: its address; this process is then not pinned,
    as the cores are this machine's and the workers run on the cluster's)."""

    cpus: frozenset[int] = frozenset()
    workers: int = 1
    sample: bool = True
    ray: str | None = None  # the Ray cluster whose nodes run the workers as actors (``loadgen.ray_workers``); None: here


@dataclass(frozen=True)
class Observation:
    """What one load run against some endpoints saw, before it is tied to a serving config."""

    load: LoadResult
    summary: RunSummary
    steady: RunSummary | None
    server_deltas: Mapping[str, float | None]
    requests_per_server: Mapping[str, float | None]  # base URL -> requests it finished (its /metrics)
    tokens: TokenCrossCheck
    client_bound: str | None
    client_cpu_busy: float  # the CPU the client used per second per client process
    started: str  # ISO 8601, UTC
    telemetry: TelemetrySummary
    timeline: Timeline | None = None  # the run over time, the samplers' quantities with the client's; None: not kept

    def record_losses(self) -> tuple[Loss, ...]:
        """What the client's records show was not the work asked for (the telemetry's conditions
        are :func:`~pytest_qwenperf.measure.validity.conditions`)."""
        off = prompt_lengths_off(self.load.records)
        short = self.load.window.short() if self.load.window is not None else None
        if self.load.options.window is not None and self.load.window is None:
            short = (
                "no window was kept: the workload's requests ran out before its batch had turned over (or its client "
                "workers' windows did not overlap); raise its num_prompts"
            )
        return tuple(
            Loss(reason=reason, detail=detail) for reason, detail in ((PROMPT_LENGTHS, off), (WINDOW_SHORT, short)) if detail
        )

    @property
    def client_cpus(self) -> tuple[int, ...]:
        """The first client process's CPUs."""
        return self.load.client_cpus[0] if self.load.client_cpus else ()


@dataclass(frozen=True)
class Watching:
    """What sees a run's records as they finish (``progress``) and may end its sending (``stop``,
    one client process only: several workers are separate processes it cannot reach)."""

    progress: Progress | None = None
    stop: Stop | None = None


def observe(target: Target, load: Load, client: ClientSetup = ClientSetup(), watching: Watching | None = None) -> Observation:
    """Drive ``load`` against ``target`` and measure: client records, the servers' /metrics
    deltas, and telemetry sampled meanwhile (see :class:`Telemetry`)."""
    watching = watching or Watching()
    metrics_urls = target.base_urls if target.metrics_urls is None else target.metrics_urls
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    before = _counters(metrics_urls)
    previous_cpus = pin_current_process(client.cpus) if client.cpus and client.ray is None else None
    telemetry = (
        Telemetry.start(
            gpu_visible_devices=target.gpu_visible_devices,
            server_pids=target.server_pids,
            client_pid=os.getpid(),
            metrics_urls=metrics_urls,
        )
        if client.sample
        else Telemetry(gpu=None, cpu=None, server=None)
    )
    try:
        cpu_start, wall_start = _client_cpu_s(), time.perf_counter()
        if client.ray is not None:
            whole = Assignment.of(target.base_urls, target.model, load.requests, load.arrival, load.options)
            result = run_load_on_ray(client.ray, client.workers, whole, progress=watching.progress)
        elif client.workers > 1:
            result = run_load_in_workers(
                client.workers, target.base_urls, target.model, load.requests, load.arrival, load.options, progress=watching.progress
            )
        else:
            result = run_load_sync(
                target.base_urls, target.model, load.requests, load.arrival, load.options, progress=watching.progress, stop=watching.stop
            )
        used = result.cpu_s if result.cpu_s is not None else _client_cpu_s() - cpu_start
        busy = used / max(time.perf_counter() - wall_start, 1e-9) / client.workers
    finally:
        telemetry.stop()
        if previous_cpus is not None:
            pin_current_process(previous_cpus)
    after = _counters(metrics_urls)
    deltas = counter_deltas(combine(before), combine(after)) if before and after else dict.fromkeys(COUNTERS)
    per_server = (
        {url: counter_deltas(b, a)["request_success"] for url, b, a in zip(metrics_urls, before, after, strict=True)}
        if before and after
        else dict.fromkeys(metrics_urls)
    )
    kept = result.window.span if result.window is not None else None  # a time-bounded run's figures are its window's
    window = kept or steady_window(result.records)
    summary = summarize(result.records, window=kept, goodput_slo=load.slo, requested_rate=result.requested_rate)
    steady = summarize(result.records, window=window) if window else None
    return Observation(
        load=result,
        summary=summary,
        steady=steady,
        server_deltas=MappingProxyType(deltas),
        requests_per_server=MappingProxyType(per_server),
        tokens=cross_check(result.records, deltas["prompt_tokens"], deltas["generation_tokens"]),
        client_bound=client_bound_reason(
            result.records, requested_rate=result.requested_rate, client_cpu_busy_fraction=busy, lag_p99_limit_s=_lag_limit_s(result.arrival)
        ),
        client_cpu_busy=busy,
        started=started,
        telemetry=telemetry.summary(window, tokens=int((steady or summary)["total_output_tokens"].value)),
        timeline=timeline(result.records, telemetry.points(), window),
    )


def _counters(urls: Sequence[str]) -> list[MetricsSnapshot] | None:
    """Each server's counters; None where /metrics is not served (a gateway, another kind of
    server) or answers with something that is not Prometheus text: the run then has no
    server-side cross-check, which its result shows (and the servers' ``unreadable``, from
    :func:`~pytest_qwenperf.serving.server.describe`, says why)."""
    try:
        return scrape_each(urls)
    except (OSError, MetricsUnreadable):
        return None


def _client_cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the load generator's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _lag_limit_s(arrival: Arrival) -> float:
    """The p99 send lag beyond which the client fell behind: a replay's own, else :data:`LAG_P99_LIMIT_S`."""
    if isinstance(arrival, Replay) and arrival.max_lag_ms is not None:
        return arrival.max_lag_ms / 1000
    return LAG_P99_LIMIT_S
