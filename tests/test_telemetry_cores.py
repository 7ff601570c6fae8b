"""Other processes on the server's cores, on real processes pinned with CPU affinity."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from pytest_qwenperf.core.validity import CONTENDED_CORES
from pytest_qwenperf.telemetry.cores import CoreTimes
from pytest_qwenperf.telemetry.cpu import CpuSampler

BURN = "while True: pass"
IDLE = "import time; time.sleep(120)"

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin a server and a competitor apart")

Spawn = Callable[[str, int], subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str, cpu: int) -> subprocess.Popen[bytes]:
        """``code`` pinned to ``cpu``, once its interpreter is up."""
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); print('up', flush=True)\n{code}"],
            stdout=subprocess.PIPE,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def watch(groups: dict[str, list[int]], seconds: float) -> CpuSampler:
    with CpuSampler(groups, interval_s=0.1, discover_every_s=0.3) as sampler:
        time.sleep(seconds)
    return sampler


def test_a_busy_process_on_the_servers_core_is_seen_and_named(spawn: Spawn) -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    server = spawn(IDLE, first)
    competitor = spawn(BURN, first)
    elsewhere = spawn(BURN, second)
    sampler = watch({"server": [server.pid]}, 2.5)
    cores = sampler.summary().server_cores

    assert cores is not None and cores.cores == (first,)
    # The competitor spins alone on the server's core (the server sleeps): whatever else runs
    # there only adds to what is not the server's.
    assert cores.contended_share is not None and cores.contended_share > 0.5
    assert cores.other_processes_busy is not None and cores.other_processes_busy.median >= CONTENDED_CORES
    named = {other.pid for other in cores.busiest_other_processes}
    assert competitor.pid in named
    assert elsewhere.pid not in named  # its affinity does not reach the server's core
    assert server.pid not in named
    assert cores.steal_share is None or 0 <= cores.steal_share <= 1


@pytest.mark.parametrize(
    ("others", "contended_share"),
    [
        (0.8, 1.0),  # the core full, 0.8 of it someone else's: contended in every interval
        (0.3, 0.0),  # 0.3 cores of someone else's on a core with room to spare: nothing taken from the server
    ],
)
def test_others_are_the_cores_time_less_the_runs_own_and_count_when_the_cores_are_full(
    spawn: Spawn, monkeypatch, others: float, contended_share: float
) -> None:
    """Scripted per-CPU times: the server's own CPU time plus ``others`` cores of someone else's,
    and 0.1 cores of steal, at a scripted clock; the sampler must find exactly those."""
    first = sorted(os.sched_getaffinity(0))[0]
    server = spawn(IDLE, first)
    now = [0.0]

    def cores(watched: object) -> CoreTimes:
        times = psutil.Process(server.pid).cpu_times()
        return CoreTimes(busy_s=times.user + times.system + others * now[0], steal_s=0.1 * now[0], total_s=now[0])

    monkeypatch.setattr("pytest_qwenperf.telemetry.cpu.CLOCK", lambda: now[0])
    monkeypatch.setattr("pytest_qwenperf.telemetry.cpu.core_times", cores)
    sampler = CpuSampler({"server": [server.pid]}, interval_s=0.1)
    for step in range(6):
        now[0] = step * 0.5
        sampler._poll()
    summary = sampler.summary().server_cores
    assert summary is not None and summary.cores == (first,)
    assert [s.other_processes for s in sampler.samples] == pytest.approx([others] * 5)
    assert summary.contended_share == pytest.approx(contended_share)
    assert summary.steal_share == pytest.approx(0.1)


def test_without_a_server_group_no_cores_are_watched(spawn: Spawn) -> None:
    first = sorted(os.sched_getaffinity(0))[0]
    proc = spawn(IDLE, first)
    sampler = watch({"client": [proc.pid]}, 0.5)
    assert sampler.summary().server_cores is None
    assert all(s.other_processes is None for s in sampler.samples)
    assert sampler.summary().as_json()["server_cores"] is None
