"""CPU time of process trees (the vLLM servers, the load generator), sampled while the load runs.

Measured as cores busy: CPU seconds (user + system) the group's processes used per
wall-clock second, so 1.0 is one core fully busy. On CPU builds this is the device
utilization; on GPU hosts it shows an API server or the client saturating a core.

Each group is its root processes plus all their descendants, looked up again while the
run goes on (vLLM's engine-core and workers are children, and may come and go). A
process belongs to the first group that claims it: the load generator's own process
tree contains the servers it started, so the servers are listed first.

The group named ``server`` also fixes the cores watched for other processes
(:mod:`pytest_qwenperf.telemetry.cores`): the cores its processes may run on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import psutil

from pytest_qwenperf.core.validity import CONTENDED_CORES
from pytest_qwenperf.telemetry.cores import CoreTimes, OtherProcess, OtherProcesses, affinity, busiest, core_times
from pytest_qwenperf.telemetry.sampling import (
    CLOCK,
    PeriodicSampler,
    SamplerHealth,
    Stats,
    Window,
    inside,
)

DEFAULT_INTERVAL_S = 0.5
DISCOVER_EVERY_S = 2.0
"""Walking /proc for descendants costs milliseconds of the client's CPU; per-process CPU times are cheap."""
SCAN_EVERY_S = 1.0
"""How often the process table is scanned for other processes on the server's cores (~3 ms for 70 processes),
and once more at the closing poll, so a run of a few seconds still names them."""


@dataclass(frozen=True)
class CpuSample:
    """Cores busy per group over the interval that ended at ``at`` (perf_counter seconds)."""

    at: float
    seconds: float  # length of the interval
    busy: tuple[float, ...]  # in the order of CpuSampler.groups
    processes: tuple[int, ...]  # live processes per group
    other_processes: float | None = None  # cores busy on the server's cores by processes outside the groups
    steal: float | None = None  # cores of the server's cores the hypervisor gave to someone else
    cores_busy: float | None = None  # the server's cores' use by every process, in cores


@dataclass(frozen=True)
class CpuGroupSummary:
    """One group over a window."""

    cores_busy: Stats | None
    cpu_seconds: float  # CPU time used over the polled intervals
    max_processes: int

    def as_json(self) -> dict[str, object]:
        return {
            "cores_busy": self.cores_busy.as_json() if self.cores_busy else None,
            "cpu_seconds": self.cpu_seconds,
            "max_processes": self.max_processes,
        }


@dataclass(frozen=True)
class ServerCoresSummary:
    """What else ran on the server's cores over a window."""

    cores: tuple[int, ...]
    other_processes_busy: Stats | None  # cores busy by processes outside the run
    contended_share: float | None  # time share of the intervals that were contended (see ``contended``)
    steal_share: float | None  # steal over the cores' time; None where the kernel reports none
    busiest_other_processes: tuple[OtherProcess, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "cores": list(self.cores),
            "others_busy": self.other_processes_busy.as_json() if self.other_processes_busy else None,
            "contended_share": self.contended_share,
            "steal_share": self.steal_share,
            "busiest_others": [other.as_json() for other in self.busiest_other_processes],
        }


@dataclass(frozen=True)
class CpuSummary:
    groups: Mapping[str, CpuGroupSummary]
    health: SamplerHealth
    tokens: int | None = None  # tokens produced inside the window
    server_cores: ServerCoresSummary | None = None  # None without a server group

    @property
    def tokens_per_server_cpu_s(self) -> float | None:
        """Tokens per CPU-second of the servers: the CPU build's work per unit of device time.

        Steadier than wall-clock throughput where the noise is the server waiting for a core
        (another process on it, a hypervisor's steal), and still moved by a release that
        spends more CPU per token. Blind to a server that is slower while using less CPU
        (a lock, a sleep), which is why it is gated beside throughput, not instead of it.
        """
        server = self.groups.get("server")
        if self.tokens is None or server is None or server.cpu_seconds <= 0:
            return None
        return self.tokens / server.cpu_seconds

    def as_json(self) -> dict[str, object]:
        return {
            "groups": {name: g.as_json() for name, g in self.groups.items()},
            "tokens": self.tokens,
            "tokens_per_server_cpu_s": self.tokens_per_server_cpu_s,
            "server_cores": self.server_cores.as_json() if self.server_cores else None,
            "sampler": self.health.as_json(),
        }


@dataclass
class _Tracked:
    process: psutil.Process
    group: int
    cpu_s: float  # user + system at the previous poll
    on_cores: bool  # its affinity reaches the server's cores


class CpuSampler(PeriodicSampler):
    """Cores busy of each named group of process trees, e.g. ``{"server": pids, "client": (pid,)}``."""

    def __init__(
        self,
        groups: Mapping[str, Sequence[int]],
        interval_s: float = DEFAULT_INTERVAL_S,
        discover_every_s: float = DISCOVER_EVERY_S,
    ) -> None:
        super().__init__(interval_s)
        self.groups = tuple(groups)
        self._roots = tuple(tuple(pids) for pids in groups.values())
        self.discover_every_s = discover_every_s
        self.samples: list[CpuSample] = []
        self._tracked: dict[int, _Tracked] = {}
        self._last_poll: float | None = None
        self._last_discovery = float("-inf")
        self._last_scan = float("-inf")
        self.cores: frozenset[int] = frozenset()  # the server's, once its processes are found
        self._core_times: CoreTimes | None = None
        self._others: OtherProcesses | None = None
        self.other_processes_seen: list[OtherProcess] = []

    def _poll(self) -> None:
        if CLOCK() - self._last_discovery >= self.discover_every_s:
            self._discover()
            self._last_discovery = CLOCK()
        if self._others is not None and (CLOCK() - self._last_scan >= SCAN_EVERY_S or self._stopping.is_set()):
            self.other_processes_seen += self._others.scan(set(self._tracked), CLOCK())
            self._last_scan = CLOCK()
        used = [0.0] * len(self.groups)
        own_on_cores = 0.0
        for pid, tracked in list(self._tracked.items()):
            try:
                times = tracked.process.cpu_times()
            except psutil.Error:  # exited since the last poll; its last slice is lost
                del self._tracked[pid]
                continue
            cpu_s = times.user + times.system
            used[tracked.group] += max(cpu_s - tracked.cpu_s, 0.0)
            own_on_cores += max(cpu_s - tracked.cpu_s, 0.0) if tracked.on_cores else 0.0
            tracked.cpu_s = cpu_s
        cores_before, cores_now = self._core_times, core_times(self.cores) if self.cores else None
        self._core_times = cores_now
        now = CLOCK()  # after reading the counters: a poll delayed before them then stays consistent
        if self._last_poll is not None:
            elapsed = now - self._last_poll
            counts = [sum(1 for t in self._tracked.values() if t.group == g) for g in range(len(self.groups))]
            others = steal = busy = None
            if cores_before is not None and cores_now is not None:
                busy = max(cores_now.busy_s - cores_before.busy_s, 0.0) / elapsed
                others = max(busy - own_on_cores / elapsed, 0.0)
                if cores_now.steal_s is not None and cores_before.steal_s is not None:
                    steal = max(cores_now.steal_s - cores_before.steal_s, 0.0) / elapsed
            if self.samples and elapsed < self.interval_s / 2:
                self.samples[-1] = _merged(self.samples[-1], now, elapsed, used, counts, (others, steal, busy))
            else:
                self.samples.append(CpuSample(now, elapsed, tuple(u / elapsed for u in used), tuple(counts), others, steal, busy))
        self._last_poll = now

    def _discover(self) -> None:
        """Track new members of each group; a process is counted in the first group that reaches it."""
        seen: set[int] = set()
        for group, roots in enumerate(self._roots):
            for process in process_trees(roots):
                if process.pid in seen:
                    continue
                seen.add(process.pid)
                if process.pid not in self._tracked:
                    self._track(process, group)
        if not self.cores and "server" in self.groups:
            server = self.groups.index("server")
            self.cores = frozenset().union(*(affinity(pid) for pid, t in self._tracked.items() if t.group == server))
            if self.cores:
                self._others = OtherProcesses(self.cores)
                for tracked in self._tracked.values():
                    tracked.on_cores = bool(self.cores & affinity(tracked.process.pid))
                self._core_times = core_times(self.cores)

    def _track(self, process: psutil.Process, group: int) -> None:
        try:
            times = process.cpu_times()
        except psutil.Error:
            return
        # A process found after the first discovery was born during the run: all its CPU time
        # belongs to the run. (Not decided by create_time(): psutil derives it from a boot time
        # in whole seconds, so it can be off by up to a second.)
        baseline = 0.0 if self._last_poll is not None else times.user + times.system
        on_cores = bool(self.cores) and bool(self.cores & affinity(process.pid))  # no cores yet: decided when found
        self._tracked[process.pid] = _Tracked(process, group, baseline, on_cores)

    def summary(self, window: Window | None = None, tokens: int | None = None) -> CpuSummary:
        """Per group: cores busy over the polls that ended inside ``window`` (all when None);
        ``tokens``: tokens produced inside the window, for tokens per server CPU-second."""
        samples = [s for s in self.samples if inside(s.at, window)]
        return CpuSummary(
            groups=MappingProxyType(
                {
                    name: CpuGroupSummary(
                        cores_busy=Stats.of(s.busy[g] for s in samples),
                        cpu_seconds=sum(s.busy[g] * s.seconds for s in samples),
                        max_processes=max((s.processes[g] for s in samples), default=0),
                    )
                    for g, name in enumerate(self.groups)
                }
            ),
            health=self.health(),
            tokens=tokens,
            server_cores=self._server_cores(samples) if self.cores else None,
        )

    def _server_cores(self, samples: Sequence[CpuSample]) -> ServerCoresSummary:
        watched = [s for s in samples if s.other_processes is not None]
        seconds = sum(s.seconds for s in watched)
        stolen = [s for s in watched if s.steal is not None]
        return ServerCoresSummary(
            cores=tuple(sorted(self.cores)),
            other_processes_busy=Stats.of(s.other_processes for s in watched),
            contended_share=sum(s.seconds for s in watched if contended(s, len(self.cores))) / seconds
            if seconds
            else None,
            steal_share=(
                sum((s.steal or 0.0) * s.seconds for s in stolen) / (seconds * len(self.cores)) if stolen and seconds else None
            ),
            busiest_other_processes=busiest(self.other_processes_seen),  # over the whole load run: who was there, not how much
        )


def contended(sample: CpuSample, cores: int) -> bool:
    """Whether other processes took the server's cores from it over ``sample``'s interval: they kept
    :data:`CONTENDED_CORES` busy while the cores had no more than that left idle. Other processes on
    cores with room to spare (a GPU server's API process on a host of many cores) slow nothing."""
    if sample.other_processes is None or sample.cores_busy is None:
        return False
    return sample.other_processes >= CONTENDED_CORES and sample.cores_busy >= cores - CONTENDED_CORES


def _merged(
    last: CpuSample,
    now: float,
    elapsed: float,
    used: Sequence[float],
    counts: Sequence[int],
    cores: tuple[float | None, float | None, float | None],  # others, steal, cores_busy over the short interval
) -> CpuSample:
    """``last`` extended by a short interval (the closing poll right after a scheduled one).

    The kernel counts CPU time in clock ticks (10 ms), so over a sub-millisecond interval
    one tick reads as many cores busy; folded into the interval before, it is exact.
    """
    seconds = last.seconds + elapsed
    busy = tuple((b * last.seconds + u) / seconds for b, u in zip(last.busy, used, strict=True))

    def rate(earlier: float | None, later: float | None) -> float | None:
        return None if earlier is None or later is None else (earlier * last.seconds + later * elapsed) / seconds

    processes = tuple(max(a, b) for a, b in zip(last.processes, counts, strict=True))
    others, steal, cores_busy = cores
    return CpuSample(
        now, seconds, busy, processes, rate(last.other_processes, others), rate(last.steal, steal), rate(last.cores_busy, cores_busy)
    )


def process_trees(roots: Sequence[int]) -> list[psutil.Process]:
    """Every root still alive, each followed by its descendants."""
    found = []
    for pid in roots:
        try:
            root = psutil.Process(pid)
            found.append(root)
            found.extend(root.children(recursive=True))
        except psutil.Error:
            continue
    return found
