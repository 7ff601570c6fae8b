"""``qwenperf doctor``'s PID visibility check and short load: a real child process (plain Python that
speaks the CUDA child's protocol, or the real torch child, which finds no CUDA here) under the
real NVML sampler, with the GPUs' readings and process lists scripted in the NVML fake."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence

import psutil
import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.serving import hardware
from pytest_qwenperf.serving.doctor import Check, DoctorOptions, run_doctor
from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu

MARK = "doctor-test-child"
SLEEPER = (
    sys.executable,
    "-c",
    f"import sys, time; print('ready', flush=True); time.sleep(float(sys.argv[1])); print('done', flush=True); time.sleep(60)  # {MARK}",
)
"""Speaks the CUDA child's protocol without a GPU: ``ready``, the load's seconds, ``done``, then waits to be stopped."""
HOST_PID = 2**22 + 1  # above the largest pid_max: a pid of another namespace, never a process here
CHILD_MEMORY = 813_694_976  # what NVML listed for the CUDA child on a real H200 (~776 MiB)
SW_POWER_CAP, GPU_IDLE = 0x4, 0x1


@pytest.fixture(autouse=True)
def fresh_hardware() -> Iterator[None]:
    hardware.detect.cache_clear()
    yield
    hardware.detect.cache_clear()


def child_pids() -> list[int]:
    """The pids of this test's sleeping child (not of the guard above it, whose argv holds the same code)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            argv = process.cmdline()
        except psutil.Error:
            continue
        if argv[1:2] == ["-c"] and MARK in argv[2]:
            found.append(process.pid)
    return found


def own_pid_listed(poll: int) -> list[tuple[int, int | None]]:
    return [(pid, CHILD_MEMORY) for pid in child_pids()]


def host_pid_listed(poll: int) -> list[tuple[int, int | None]]:
    return [(HOST_PID, CHILD_MEMORY)] if child_pids() else []


def doctor(
    monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], load_seconds: float = 1, child: tuple[str, ...] = SLEEPER
) -> list[Check]:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.module(gpus))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    report = run_doctor(DoctorOptions(load_seconds=load_seconds, child=child))
    assert not child_pids(), "the child outlived the doctor"
    return [c for c in report.checks if c.group in ("pid", "load")]


def row(checks: Sequence[Check], name: str, gpu: int | None = None) -> Check:
    found = [c for c in checks if c.name == name and (gpu is None or gpu in c.gpus)]
    assert len(found) == 1, f"{name} (GPU {gpu}): {found}"
    return found[0]


def test_own_pid_listed_and_a_healthy_gpu_at_its_power_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200 at full load: busy all the time, ``sw_power_cap`` in every sample at its default limit."""
    gpu = FakeGpu(
        "GPU-0",
        utilization=100,
        clock_events=[GPU_IDLE, SW_POWER_CAP],
        power_mw=691_000,
        sm_clock_mhz=1481,
        processes=own_pid_listed,
    )
    checks = doctor(monkeypatch, [gpu])
    visibility = row(checks, "PID visibility")
    assert visibility.status == "ok"
    assert (
        f"NVML listed this check's process (pid {visibility.figure.split('pid ')[1].split()[0]} with 776 MiB)"
        in visibility.figure
    )
    assert "it reports this namespace's pids" in visibility.figure
    load = row(checks, "under load", 0)
    assert (load.status, load.advice) == ("ok", "")
    assert "utilization 100.0%" in load.figure and "SM activity 60.0%" in load.figure and "tensor activity 45.0%" in load.figure
    assert "691 W (99% of its 700 W limit)" in load.figure
    assert "SM clock 1481 MHz (min 1481, max 1980)" in load.figure
    assert "clock events sw_power_cap 100%" in load.figure and "held back 0.0% (limit 10%)" in load.figure
    assert load.values["held_back_share"] == 0 and load.values["clock_events"] == {"sw_power_cap": 1.0}
    assert load.values["power_limit_w"] == load.values["default_power_limit_w"] == 700


def test_host_pids_and_a_gpu_power_capped_below_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        FakeGpu("GPU-0", utilization=100, clock_events=[GPU_IDLE, SW_POWER_CAP], processes=host_pid_listed),
        FakeGpu(
            "GPU-1", utilization=100, clock_events=[GPU_IDLE, SW_POWER_CAP], power_limit_mw=500_000, processes=host_pid_listed
        ),
    ]
    checks = doctor(monkeypatch, gpus)
    visibility = row(checks, "PID visibility")
    assert visibility.status == "warn"
    assert visibility.figure.startswith("NVML reports host pids (a container without the host PID namespace)")
    assert f"it listed pid {HOST_PID}" in visibility.figure and "gpu-shared" in visibility.figure
    assert "--pid=host" in visibility.advice
    assert row(checks, "under load", 0).status == "ok"
    capped = row(checks, "under load", 1)
    assert capped.status == "fail" and "held back 100.0% (limit 10%)" in capped.figure
    assert "held below its clocks by sw_power_cap" in capped.advice and "nvidia-smi -pl 700" in capped.advice


def test_no_process_listed_a_gpu_that_is_not_kept_busy_and_one_without_clock_events(monkeypatch: pytest.MonkeyPatch) -> None:
    unread = FakeGpu("GPU-1", utilization=100, not_supported=frozenset({"nvmlDeviceGetCurrentClocksEventReasons"}))
    checks = doctor(monkeypatch, [FakeGpu("GPU-0", utilization=50, clock_events=GPU_IDLE), unread])
    visibility = row(checks, "PID visibility")
    assert visibility.status == "warn" and visibility.figure.startswith(
        "NVML listed no process while this check's child held memory"
    )
    idle = row(checks, "under load", 0)
    assert idle.status == "fail" and "utilization 50.0%" in idle.figure
    assert "under 90% busy under a plain matrix load" in idle.advice
    incomplete = row(checks, "under load", 1)
    assert incomplete.status == "warn" and "held back not read" in incomplete.figure and "not read" in incomplete.advice


def test_thermal_slowdown_under_load_fails_at_any_power_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu("GPU-0", utilization=100, clock_events=[GPU_IDLE, 0x20 | SW_POWER_CAP], processes=own_pid_listed)
    hot = row(doctor(monkeypatch, [gpu]), "under load", 0)
    assert hot.status == "fail" and "held below its clocks by sw_thermal_slowdown" in hot.advice
    assert "nvidia-smi -pl" not in hot.advice


def test_no_load_checks_pid_visibility_only(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = doctor(monkeypatch, [FakeGpu("GPU-0", processes=own_pid_listed)], load_seconds=0)
    assert [(c.name, c.status) for c in checks] == [("PID visibility", "ok")]


def test_a_child_that_fails_or_has_no_cuda_leaves_both_checks_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    crashed = doctor(
        monkeypatch,
        [FakeGpu("GPU-0")],
        child=(sys.executable, "-c", "import sys; print('CUDA error: out of memory'); sys.exit(3)"),
    )
    assert [(c.name, c.status) for c in crashed] == [("PID visibility", "warn"), ("under load", "warn")]
    assert "the CUDA child exited with status 3 before it said 'ready': CUDA error: out of memory" in crashed[0].figure
    no_cuda = doctor(
        monkeypatch,
        [FakeGpu("GPU-0")],
        child=(sys.executable, "-c", "print('unavailable: torch 2.13.0+cpu sees no CUDA device')"),
    )
    assert no_cuda[0].figure == "not checked (needs torch with CUDA: torch 2.13.0+cpu sees no CUDA device)"
    assert no_cuda[1].figure == "not run (needs torch with CUDA: torch 2.13.0+cpu sees no CUDA device)"


def test_cli_json_with_the_real_torch_child(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The default child: torch is the CPU build here, so both checks say they need torch with CUDA; warnings exit 0."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.module([FakeGpu("GPU-0", clock_events=GPU_IDLE)]))
    assert main(["doctor", "--json", "--load-seconds", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    load = [c for c in report["checks"] if c["group"] in ("pid", "load")]
    assert [(c["name"], c["status"]) for c in load] == [("PID visibility", "warn"), ("under load", "warn")]
    assert "needs torch with CUDA" in load[0]["figure"]
    gpu_rows = [c["name"] for c in report["checks"] if c["group"] == "gpu"]
    assert gpu_rows[:2] == ["NVML", "GPU model and count"] and "other processes" in gpu_rows
    assert report["status"] == "warn" and report["machine"]["gpu_count"] == 1
    assert {c["group"] for c in report["checks"]} == {"gpu", "pid", "load", "cpu", "software"}
