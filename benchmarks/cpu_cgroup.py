"""A cgroup of the kernel's ``cpu`` controller that slows a process tree by a known amount.

The benchmarks make a controlled slowdown with it: a CFS bandwidth quota (v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, or v2 ``cpu.max``) below what the tree uses.
:mod:`benchmarks.gate_power` switches the quota of one server between repeats;
:mod:`benchmarks.quota_launcher` starts a server inside a group of fixed quota. Needs root
(or a delegated, writable cgroup). A group is removed by its owner on exit; one left by an
owner that was killed is removed by the next :meth:`CpuCgroup.create`.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "qwenperf-cpu-"


class CgroupError(RuntimeError):
    """The cpu controller cannot be used here; the message says what is missing."""


@dataclass(frozen=True)
class Throttling:
    """The cgroup's CFS counters (``cpu.stat``); the difference of two readings is a repeat's."""

    periods: int
    throttled_periods: int
    throttled_s: float

    def since(self, before: Throttling) -> Throttling:
        return Throttling(
            self.periods - before.periods, self.throttled_periods - before.throttled_periods, self.throttled_s - before.throttled_s
        )


@dataclass(frozen=True)
class CpuCgroup:
    """A cgroup of the cpu controller made for this run; a context manager that removes it on exit."""

    path: Path
    version: int  # 1 or 2
    period_us: int

    @classmethod
    def create(cls, period_us: int, root: Path = CGROUP_ROOT) -> CpuCgroup:
        """``root/cpu/<unique>`` on cgroup v1, ``root/<unique>`` on v2 (a unified hierarchy at ``root``)."""
        if (root / "cgroup.controllers").exists():
            version, parent = 2, root
            if "cpu" not in (root / "cgroup.controllers").read_text().split():
                raise CgroupError(f"{root}: the cpu controller is not available (cgroup.controllers has no 'cpu')")
            if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                _write(root / "cgroup.subtree_control", "+cpu")
        else:
            version, parent = 1, root / "cpu"
            if not (parent / "cpu.cfs_quota_us").exists():
                raise CgroupError(f"{parent}: no cgroup v1 cpu controller with CFS bandwidth control mounted there")
        for stale in stale_cgroups(parent):
            stale.rmdir()
        path = parent / f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except OSError as exc:
            raise CgroupError(f"cannot create the cgroup {path}: {exc} (run as root, or in a cgroup delegated to you)") from None
        cgroup = cls(path, version, period_us)
        try:
            cgroup.set_quota(None)
        except BaseException:
            path.rmdir()
            raise
        return cgroup

    def set_quota(self, quota: int | None) -> None:
        """At most ``quota`` µs of CPU per period for the whole cgroup; None: no limit."""
        if self.version == 1:
            _write(self.path / "cpu.cfs_period_us", str(self.period_us))
            _write(self.path / "cpu.cfs_quota_us", "-1" if quota is None else str(quota))
        else:
            _write(self.path / "cpu.max", f"{'max' if quota is None else quota} {self.period_us}")

    def adopt(self, procs: Iterable[psutil.Process]) -> int:
        """Move every live process of ``procs`` into the cgroup (their later children are born in it);
        how many processes the cgroup holds then."""
        procs = list(procs)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                _write(self.path / "cgroup.procs", str(proc.pid))
        members = self.members()
        strays = sorted(proc.pid for proc in procs if proc.pid not in members and _running(proc))
        if strays:
            raise CgroupError(f"processes {strays} of the server are not in {self.path} after moving them there")
        return len(members)

    def members(self) -> set[int]:
        return {int(pid) for pid in (self.path / "cgroup.procs").read_text().split()}

    def throttling(self) -> Throttling:
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line.strip())
        if self.version == 1:
            throttled_s = int(stat.get("throttled_time", 0)) / 1e9
        else:
            throttled_s = int(stat.get("throttled_usec", 0)) / 1e6
        return Throttling(int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0)), throttled_s)

    def remove(self) -> None:
        """Move what is left in the cgroup back to its parent and remove it."""
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError):
                _write(self.path.parent / "cgroup.procs", str(pid))
        deadline = time.monotonic() + 10
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:  # EBUSY while exiting processes are still being released
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except ProcessLookupError:
        raise
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc}") from None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stale_cgroups(parent: Path) -> list[Path]:
    """Empty cgroups of earlier runs that were killed before they could remove their own."""
    stale = []
    for path in sorted(parent.glob(f"{CGROUP_PREFIX}*")):
        owner = path.name.removeprefix(CGROUP_PREFIX).partition("-")[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)) and not (path / "cgroup.procs").read_text().strip():
            stale.append(path)
    return stale
