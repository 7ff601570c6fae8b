"""A pool boots the next config beside the one asked for, on the other cores, and moves it onto its own when asked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

from pytest_qwenperf.serving.pool import BootFailedEarlier, PoolSettings, ServerPool
from pytest_qwenperf.suite.config import ServingConfig

STANDIN = (sys.executable, str(Path(__file__).parent / "standins" / "openai_standin.py"))
CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="needs two cores: one to measure on, one to boot beside it")


def config(name: str, *flags: str) -> ServingConfig:
    return ServingConfig(id=name, model="standin-model", vllm_args=("--ready-after", "1", *flags), suite="standin")


def affinities(pid_file: Path) -> set[frozenset[int]]:
    """The CPU sets of every thread of the processes whose pids the stand-in wrote (its tree)."""
    found = set()
    for pid in (int(line) for line in pid_file.read_text().split()):
        for thread in psutil.Process(pid).threads():
            found.add(frozenset(os.sched_getaffinity(thread.id)))
    return found


def test_the_next_config_boots_beside_on_the_other_cores_and_moves_onto_its_own(tmp_path: Path) -> None:
    measured, spare = frozenset(CORES[:1]), frozenset(CORES[1:])
    first, second = config("first"), config("second", "--children", "1", "--pid-file", str(tmp_path / "second.pids"))
    pool = ServerPool(PoolSettings(log_dir=tmp_path, launcher=STANDIN, boot_timeout_s=30))
    try:
        pool.get(first, measured, then=second)
        assert pool.boots == {"standin/first": 1, "standin/second": 1}  # both booted by the one call
        assert min(pool.boot_seconds.values()) >= 1.0
        assert pool.booting_s < sum(pool.boot_seconds.values())  # the caller waited once for both (each at least 1 s)
        assert affinities(tmp_path / "second.pids") == {spare}  # idle meanwhile, off the measured cores
        pool.release("standin/first")
        pool.get(second, measured)
        assert affinities(tmp_path / "second.pids") == {measured}  # every thread of its tree
        assert pool.boots["standin/second"] == 1  # moved, not booted again
    finally:
        pool.close()


def test_a_config_that_fails_to_boot_beside_fails_when_asked_for_not_before(tmp_path: Path) -> None:
    pool = ServerPool(PoolSettings(log_dir=tmp_path, launcher=STANDIN, boot_timeout_s=30))
    broken = config("broken", "--exit-during-boot", "3")
    try:
        server = pool.get(config("first"), frozenset(CORES[:1]), then=broken)
        assert server.is_alive()
        with pytest.raises(BootFailedEarlier, match="standin/broken"):
            pool.get(broken, frozenset(CORES[:1]))
    finally:
        pool.close()


def test_nothing_boots_beside_a_server_that_has_every_core_or_beside_replicas(tmp_path: Path) -> None:
    pool = ServerPool(PoolSettings(log_dir=tmp_path, launcher=STANDIN, boot_timeout_s=30))
    replicas = ServingConfig(id="dp2", model="standin-model", vllm_args=("--ready-after", "1"), suite="standin", replicas=2)
    try:
        pool.get(config("all"), frozenset(CORES), then=config("next"))
        pool.get(config("first"), frozenset(CORES[:1]), then=replicas)
        assert pool.boots == {"standin/all": 1, "standin/first": 1}
    finally:
        pool.close()
