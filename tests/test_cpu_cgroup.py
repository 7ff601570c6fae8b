"""benchmarks/cpu_cgroup.py on fake cgroup trees: the quota files of v1 and v2, a missing
controller, stale groups of killed owners, and the throttling counters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import cpu_cgroup
from benchmarks.cpu_cgroup import CgroupError, CpuCgroup, Throttling, stale_cgroups


def _v1_root(tmp_path: Path) -> Path:
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    return tmp_path


def test_cgroup_v1_quota_files(tmp_path: Path) -> None:
    cgroup = CpuCgroup.create(20_000, root=_v1_root(tmp_path))
    assert cgroup.version == 1 and cgroup.path.parent == tmp_path / "cpu"
    assert cgroup.path.name.startswith(cpu_cgroup.CGROUP_PREFIX)
    assert (cgroup.path / "cpu.cfs_quota_us").read_text() == "-1"  # created unthrottled
    cgroup.set_quota(17_000)
    assert (cgroup.path / "cpu.cfs_period_us").read_text() == "20000"
    assert (cgroup.path / "cpu.cfs_quota_us").read_text() == "17000"
    cgroup.set_quota(None)
    assert (cgroup.path / "cpu.cfs_quota_us").read_text() == "-1"


def test_cgroup_v2_quota_file(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    cgroup = CpuCgroup.create(100_000, root=tmp_path)
    assert cgroup.version == 2 and cgroup.path.parent == tmp_path
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"  # what the kernel is asked
    assert (cgroup.path / "cpu.max").read_text() == "max 100000"
    cgroup.set_quota(90_000)
    assert (cgroup.path / "cpu.max").read_text() == "90000 100000"


def test_cgroup_without_the_cpu_controller_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="no cgroup v1 cpu controller"):
        CpuCgroup.create(100_000, root=tmp_path)
    (tmp_path / "cgroup.controllers").write_text("memory io\n")
    with pytest.raises(CgroupError, match="cpu controller is not available"):
        CpuCgroup.create(100_000, root=tmp_path)


def test_stale_cgroups_are_the_empty_ones_of_dead_runs(tmp_path: Path) -> None:
    def cgroup(name: str, procs: str = "") -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "cgroup.procs").write_text(procs)
        return path

    dead = cgroup(f"{cpu_cgroup.CGROUP_PREFIX}999999999-abc")
    cgroup(f"{cpu_cgroup.CGROUP_PREFIX}999999998-abc", "4242\n")  # still holds a process: left alone
    cgroup(f"{cpu_cgroup.CGROUP_PREFIX}{os.getpid()}-abc")  # its run is alive
    cgroup("someone-else-999999999")
    assert stale_cgroups(tmp_path) == [dead]


def test_throttling_counters_per_version(tmp_path: Path) -> None:
    v1 = CpuCgroup(tmp_path, 1, 100_000)
    (tmp_path / "cpu.stat").write_text("nr_periods 120\nnr_throttled 30\nthrottled_time 2500000000\nnr_bursts 0\nburst_time 0\n")
    assert v1.throttling() == Throttling(120, 30, 2.5)
    v2 = CpuCgroup(tmp_path, 2, 100_000)
    (tmp_path / "cpu.stat").write_text("usage_usec 9\nnr_periods 10\nnr_throttled 4\nthrottled_usec 1500000\n")
    assert v2.throttling() == Throttling(10, 4, 1.5)
    assert Throttling(10, 4, 1.5).since(Throttling(4, 1, 0.5)) == Throttling(6, 3, 1.0)
