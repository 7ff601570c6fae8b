"""The CPU sampler on real processes: busy and idle children, descendants that appear later."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from pytest_qwenperf.telemetry.cpu import CpuSampler

BURN = "while True: pass"
IDLE = "import time; time.sleep(120)"
# An idle parent that starts a burning child after a while (as vLLM's API server starts its engine core).
LATE_CHILD = (
    "import subprocess, sys, time; time.sleep(0.6); "
    f"child = subprocess.Popen([sys.executable, '-c', {BURN!r}]); time.sleep(120)"
)


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        """Start ``code`` once the interpreter is up (its start-up CPU time is not what a test measures)."""
        proc = subprocess.Popen([sys.executable, "-c", f"print('up', flush=True)\n{code}"], stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        return proc

    yield start
    for proc in started:
        for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            child.kill()
        proc.kill()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def tree_cpu_seconds(but: int) -> float:
    """CPU seconds of this process and every descendant but ``but``, those already reaped included:
    what the sampler may count as the client's. The test session has other children (servers and
    sources of other tests' fixtures), and they are the client's too."""
    me = psutil.Process()
    total = 0.0
    for process in (me, *me.children(recursive=True)):  # read as the sampler reads them: /proc, in clock ticks
        if process.pid == but:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):  # reaped meanwhile: its time is in its parent's reaped children
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def await_first_sample(sampler: CpuSampler) -> None:
    """Wait until the sampler has polled twice: its counters now start before anything read after this."""
    deadline = time.monotonic() + 30
    while not sampler.samples:
        assert time.monotonic() < deadline, "the sampler never polled"
        time.sleep(0.01)


# How much of a core a busy loop gets depends on what else runs on the machine (one core when
# idle, a fraction on a loaded CI runner), so no test asserts a share of a core. What the
# sampler counts is asserted exactly: the CPU time the OS reports for the same processes,
# between what they used inside the polled span and what they used around it.


def test_a_busy_process_is_counted_with_its_cpu_time_and_an_idle_one_as_none(spawn) -> None:
    burner, sleeper = spawn(BURN), spawn(IDLE)
    outer = cpu_seconds(burner.pid)
    with CpuSampler({"busy": [burner.pid], "idle": [sleeper.pid]}, interval_s=0.1) as sampler:
        await_first_sample(sampler)
        inner = cpu_seconds(burner.pid)
        time.sleep(1.5)
        inner = cpu_seconds(burner.pid) - inner
    outer = cpu_seconds(burner.pid) - outer
    summary = sampler.summary()
    busy, idle = summary.groups["busy"], summary.groups["idle"]

    assert 0 < inner <= busy.cpu_seconds + 1e-9 and busy.cpu_seconds <= outer + 1e-9
    assert busy.cores_busy.mean > 0 and idle.cores_busy.max < 0.05
    assert busy.max_processes == idle.max_processes == 1
    assert summary.health.polls >= 5 and summary.health.failed_polls == 0  # 16 on time


def test_a_poll_right_after_another_extends_the_interval_before(spawn, monkeypatch) -> None:
    """The closing poll can come microseconds after a scheduled one; one 10 ms clock tick
    over such an interval would read as many cores busy (seen in CI: 15.8 on a 2-core machine)."""
    burner = spawn(BURN)
    now = [0.0]
    monkeypatch.setattr("pytest_qwenperf.telemetry.cpu.CLOCK", lambda: now[0])
    sampler = CpuSampler({"busy": [burner.pid]}, interval_s=0.1)
    outer = cpu_seconds(burner.pid)
    sampler._poll()
    inner = cpu_seconds(burner.pid)
    time.sleep(0.3)
    now[0] = 0.3
    sampler._poll()
    time.sleep(0.02)  # a tick of CPU time lands in the short interval (on an idle machine: when loaded, maybe not)
    now[0] = 0.3005
    inner = cpu_seconds(burner.pid) - inner
    sampler._poll()
    outer = cpu_seconds(burner.pid) - outer

    [sample] = sampler.samples
    assert sample.seconds == pytest.approx(0.3005)
    assert inner <= sample.busy[0] * sample.seconds + 1e-9 <= outer + 2e-9  # the CPU time of both intervals


def test_descendants_that_appear_later_are_counted(spawn) -> None:
    """A child born during the run counts with all its CPU time, from its start."""
    parent = spawn(LATE_CHILD)
    parent_cpu = cpu_seconds(parent.pid)
    with CpuSampler({"server": [parent.pid]}, interval_s=0.1, discover_every_s=0.1) as sampler:
        time.sleep(2.0)
        (child,) = psutil.Process(parent.pid).children()
        child_cpu = cpu_seconds(child.pid)
    parent_cpu = cpu_seconds(parent.pid) - parent_cpu
    early = [s for s in sampler.samples if s.processes[0] == 1]
    late = [s for s in sampler.samples if s.processes[0] == 2]
    assert early and late, "the child should appear while sampling"
    assert max(s.busy[0] for s in early) < 0.3  # the parent only sleeps (after starting up)
    late_cpu = sum(s.busy[0] * s.seconds for s in late)
    assert 0 < child_cpu <= late_cpu + 1e-9 and late_cpu <= cpu_seconds(child.pid) + parent_cpu + 1e-9
    assert sampler.summary().groups["server"].max_processes == 2


def test_servers_started_by_the_client_count_as_server_not_client(spawn) -> None:
    server = spawn(BURN)  # a child of this (client) process
    outer, own = cpu_seconds(server.pid), tree_cpu_seconds(but=server.pid)
    with CpuSampler({"server": [server.pid], "client": [os.getpid()]}, interval_s=0.1) as sampler:
        await_first_sample(sampler)
        inner = cpu_seconds(server.pid)
        time.sleep(1.0)
        inner = cpu_seconds(server.pid) - inner
    outer, own = cpu_seconds(server.pid) - outer, tree_cpu_seconds(but=server.pid) - own
    groups = sampler.summary().groups
    assert 0 < inner <= groups["server"].cpu_seconds + 1e-9 and groups["server"].cpu_seconds <= outer + 1e-9
    # this process and its other children (it sleeps; its sampler thread polls), not the burner
    assert groups["client"].cpu_seconds <= own + 1e-9
    assert groups["server"].max_processes == 1  # counted once, in the first group that claims it


def test_a_window_selects_polls_and_a_process_that_exits_is_dropped(spawn) -> None:
    burner = spawn(BURN)
    with CpuSampler({"server": [burner.pid]}, interval_s=0.1) as sampler:
        time.sleep(0.8)
        burner.kill()
        burner.wait()
        time.sleep(0.5)
    last = sampler.samples[-1]
    assert last.busy == (0.0,) and last.processes == (0,)
    window = (sampler.samples[0].at, sampler.samples[3].at)
    assert sampler.summary(window).groups["server"].cores_busy.count == 4
    assert sampler.health().failed_polls == 0


def test_tokens_per_server_cpu_second_divides_the_windows_tokens_by_the_servers_cpu_time(spawn) -> None:
    burner = spawn(BURN)
    with CpuSampler({"server": [burner.pid], "client": [os.getpid()]}, interval_s=0.1) as sampler:
        await_first_sample(sampler)
        time.sleep(0.6)
    summary = sampler.summary(tokens=3_000)
    used = summary.groups["server"].cpu_seconds
    assert used > 0 and summary.tokens_per_server_cpu_s == pytest.approx(3_000 / used)
    assert summary.as_json()["tokens_per_server_cpu_s"] == summary.tokens_per_server_cpu_s
    assert sampler.summary().tokens_per_server_cpu_s is None  # no token count: no rate
    idle = CpuSampler({"client": [os.getpid()]}, interval_s=0.1)
    assert idle.summary(tokens=3_000).tokens_per_server_cpu_s is None  # no server group: no rate
