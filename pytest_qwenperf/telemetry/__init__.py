"""What the server and the devices were doing during a load run.

:class:`Telemetry` starts the samplers a run needs (NVML on the GPUs the replicas see,
psutil on the server and client process trees, the servers' /metrics gauges), each in
its own thread, and summarizes them over the run's steady-state window afterwards::

    telemetry = Telemetry.start(gpu_visible_devices=["0,1"], server_pids=[pid],
                                client_pid=os.getpid(), metrics_urls=server.base_urls)
    try:
        load = run_load_sync(...)
    finally:
        telemetry.stop()
    block = telemetry.summary(steady_window(load.records), tokens=output_tokens).as_json()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from pytest_qwenperf.telemetry.cpu import DEFAULT_INTERVAL_S as CPU_INTERVAL_S
from pytest_qwenperf.telemetry.cpu import CpuSampler, CpuSummary, process_trees
from pytest_qwenperf.telemetry.gauges import DEFAULT_INTERVAL_S as METRICS_INTERVAL_S
from pytest_qwenperf.telemetry.gauges import GaugeSummary, MetricsPoller
from pytest_qwenperf.telemetry.gpu_records import GpuSummary
from pytest_qwenperf.telemetry.nvml import DEFAULT_INTERVAL_S as NVML_INTERVAL_S
from pytest_qwenperf.telemetry.nvml import NvmlSampler
from pytest_qwenperf.telemetry.sampling import Window


@dataclass(frozen=True)
class TelemetrySummary:
    """Every sampler's summary over one window; a sampler that was not asked for is None."""

    window: Window | None
    gpu: GpuSummary | None
    cpu: CpuSummary | None
    server: GaugeSummary | None

    def as_json(self) -> dict[str, object]:
        return {
            "window_s": self.window[1] - self.window[0] if self.window else None,
            "gpu": self.gpu.as_json() if self.gpu else None,
            "cpu": self.cpu.as_json() if self.cpu else None,
            "server_gauges": self.server.as_json() if self.server else None,
        }


class Telemetry:
    """The samplers of one load run; start them just before the load and stop them just after."""

    def __init__(self, gpu: NvmlSampler | None, cpu: CpuSampler | None, server: MetricsPoller | None) -> None:
        self.gpu = gpu
        self.cpu = cpu
        self.server = server

    @classmethod
    def start(
        cls,
        *,
        gpu_visible_devices: Sequence[str | None] = (),
        server_pids: Sequence[int] = (),
        client_pid: int | None = None,
        metrics_urls: Sequence[str] = (),
        interval_s: float = NVML_INTERVAL_S,
        cpu_interval_s: float = CPU_INTERVAL_S,
        metrics_interval_s: float = METRICS_INTERVAL_S,
    ) -> Telemetry:
        """Start what was asked for; a sampler that cannot run here says why in its summary.

        ``gpu_visible_devices``: each replica's ``CUDA_VISIBLE_DEVICES`` (None: unset, all
        GPUs); empty: no GPU sampling. ``server_pids``: the servers' root processes (their
        descendants are included; on a GPU, any other process holding memory is reported);
        ``client_pid``: the load generator (with its worker processes, but not the servers it
        started). ``metrics_urls``: server base URLs.
        """
        groups = {
            name: pids for name, pids in (("server", tuple(server_pids)), ("client", _pids(client_pid))) if pids
        }

        def own() -> set[int]:  # the GPU's users that are the run's: the servers' processes now
            return {process.pid for process in process_trees(server_pids)}

        samplers = cls(
            gpu=NvmlSampler(gpu_visible_devices, interval_s, own_pids=own) if gpu_visible_devices else None,
            cpu=CpuSampler(groups, cpu_interval_s) if groups else None,
            server=MetricsPoller(metrics_urls, metrics_interval_s) if metrics_urls else None,
        )
        for sampler in (samplers.gpu, samplers.cpu, samplers.server):
            if sampler is not None:
                sampler.start()
        return samplers

    def stop(self) -> None:
        """Stop every sampler (each takes a closing sample first); idempotent."""
        for sampler in (self.gpu, self.cpu, self.server):
            if sampler is not None:
                sampler.stop()

    def summary(self, window: Window | None = None, tokens: int | None = None) -> TelemetrySummary:
        """Summaries over ``window`` (perf_counter seconds, as the request records; None: everything).

        ``tokens``: tokens produced inside the window, for tokens per joule and per server CPU-second.
        """
        return TelemetrySummary(
            window=window,
            gpu=self.gpu.summary(window, tokens) if self.gpu else None,
            cpu=self.cpu.summary(window, tokens) if self.cpu else None,
            server=self.server.summary(window) if self.server else None,
        )

    def points(self) -> dict[str, list[tuple[float, float]]]:
        """Every sampled quantity of the run as (clock time, value) points, by its name in
        :data:`~pytest_qwenperf.core.timeline.SERIES` (each GPU's points under the same name);
        complete once the samplers are stopped."""
        found: dict[str, list[tuple[float, float]]] = {}

        def add(name: str, at: float, value: float | None) -> None:
            if value is not None:
                found.setdefault(name, []).append((at, float(value)))

        for device in self.gpu.devices if self.gpu else ():
            for sample in self.gpu.samples(device.uuid) if self.gpu else ():
                add("gpu_utilization", sample.at, sample.utilization)
                add("sm_activity", sample.at, sample.sm_activity)
                add("power_w", sample.at, sample.power_w)
        if self.cpu is not None and "server" in self.cpu.groups:
            server = self.cpu.groups.index("server")
            for cpu in self.cpu.samples:
                add("server_cpu_cores", cpu.at, cpu.busy[server])
        for gauges in self.server.samples if self.server else ():
            add("running", gauges.at, gauges.running)
            add("waiting", gauges.at, gauges.waiting)
            add("kv_cache_usage", gauges.at, gauges.kv_cache_usage)
        return found

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _pids(pid: int | None) -> tuple[int, ...]:
    return () if pid is None else (pid,)
