"""The server's cores: what else ran on them while the load ran.

A server's speed on the CPU build is the speed of the cores it got. Another busy process on
those cores, or a hypervisor giving their time to another guest (steal), makes a run slower
with no change in vLLM. Per poll this reads the kernel's per-CPU times of the server's cores
(every process's use, and steal) so that the CPU sampler can subtract the run's own processes'
use from it; what is left is other processes. A scan of the process table (every few seconds,
a few milliseconds each) names the busiest of them.

Counted as the run's own: the server trees and the load generator, where their CPU affinity
reaches the server's cores. A process whose affinity reaches the cores is counted there whole,
even if it also ran elsewhere, so other processes' use is never over-stated by the run's own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import psutil

BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
"""The per-CPU times that are work (``guest`` is already inside ``user``); idle, iowait and steal are not."""

NOTED_CORES = 0.1
"""An other process is noted when it used at least this many of the server's cores between two scans."""


@dataclass(frozen=True)
class CoreTimes:
    """Cumulative seconds of the watched cores, summed: work by anyone, steal, and all of it
    (work, idle, iowait and steal), the denominator of a share of the cores' time."""

    busy_s: float
    steal_s: float | None  # None where the kernel reports no steal
    total_s: float


ALL_FIELDS = (*BUSY_FIELDS, "idle", "iowait", "steal")


def core_times(cores: Collection[int] | None = None) -> CoreTimes:
    """The watched cores' cumulative times now (``/proc/stat`` through psutil); None: every CPU."""
    per_cpu = psutil.cpu_times(percpu=True)
    chosen = per_cpu if cores is None else [per_cpu[i] for i in sorted(cores) if i < len(per_cpu)]
    steal = [getattr(t, "steal", None) for t in chosen]
    return CoreTimes(
        busy_s=sum(getattr(t, name, 0.0) for t in chosen for name in BUSY_FIELDS),
        steal_s=None if any(s is None for s in steal) else sum(s for s in steal if s is not None),
        total_s=sum(getattr(t, name, 0.0) for t in chosen for name in ALL_FIELDS),
    )


def affinity(pid: int) -> frozenset[int]:
    """The cores ``pid`` may run on; empty when it cannot be read (gone, or not allowed)."""
    try:
        return frozenset(psutil.Process(pid).cpu_affinity() or ())
    except (psutil.Error, AttributeError):  # AttributeError: a platform without affinity
        return frozenset()


@dataclass(frozen=True)
class OtherProcess:
    """A process outside the run that used the server's cores: at ``at``, ``cores_busy`` cores since the scan before."""

    pid: int
    name: str
    cores_busy: float
    at: float

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "name": self.name, "cores_busy": self.cores_busy}


class OtherProcesses:
    """Scans the process table for busy processes outside the run that may run on ``cores``.

    psutil keeps a process's CPU times between scans, so each scan gives every process's use
    since the one before; the first scan only starts the count.
    """

    def __init__(self, cores: Collection[int]) -> None:
        self.cores = frozenset(cores)
        self._known: dict[int, psutil.Process] = {}

    def scan(self, own: Collection[int], at: float) -> list[OtherProcess]:
        """Processes not in ``own`` whose affinity reaches the cores and that used :data:`NOTED_CORES` or more."""
        found = []
        alive: dict[int, psutil.Process] = {}
        for process in psutil.process_iter():
            if process.pid in own:
                continue
            known = self._known.get(process.pid, process)
            try:
                busy = known.cpu_percent(None) / 100
                if process.pid not in self._known or busy < NOTED_CORES or not self.cores & set(known.cpu_affinity() or ()):
                    alive[process.pid] = known
                    continue
                found.append(OtherProcess(process.pid, known.name(), busy, at))
            except psutil.Error:
                continue
            alive[process.pid] = known
        self._known = alive
        return found


def busiest(seen: Iterable[OtherProcess], count: int = 3) -> tuple[OtherProcess, ...]:
    """The ``count`` processes that used the most, each at its busiest scan."""
    most: dict[int, OtherProcess] = {}
    for other in seen:
        if other.pid not in most or other.cores_busy > most[other.pid].cores_busy:
            most[other.pid] = other
    return tuple(sorted(most.values(), key=lambda o: -o.cores_busy)[:count])
