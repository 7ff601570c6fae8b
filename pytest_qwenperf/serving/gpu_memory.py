"""Who holds memory on the GPUs a session needs: they must be empty before a server boots.

A vLLM server left by a crashed night, another team's job or a notebook holding a CUDA
context takes memory that vLLM then cannot have (``gpu-memory-utilization`` is a share of
the whole device), so the boot fails or, worse, runs with a smaller KV cache and measures
a regression that is not vLLM's. A GPU's memory is also not free the instant a server
exits: like vLLM's own CI, wait for it to drain, and then name what still holds it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from pytest_qwenperf.core.apikey import shown_command
from pytest_qwenperf.telemetry.gpu_select import select_devices
from pytest_qwenperf.telemetry.nvml import nvml_text

DRAIN_TIMEOUT_S = 30.0
"""How long memory freed by a process that just exited may take to show as free."""


@dataclass(frozen=True)
class GpuHolder:
    """One process with memory on one GPU."""

    gpu: int  # NVML index
    pid: int
    used_bytes: int | None  # None: NVML keeps no per-process figure (some drivers, containers)
    command: str  # "?" for a process in another PID namespace

    def describe(self) -> str:
        held = f"{self.used_bytes / 2**30:.1f} GiB" if self.used_bytes is not None else "an unknown amount of memory"
        return f"GPU {self.gpu}: pid {self.pid} ({self.command}) holds {held}"


def holders(visible: Sequence[str | None]) -> tuple[GpuHolder, ...]:
    """Processes with memory on the GPUs that ``visible`` selects (each entry a
    ``CUDA_VISIBLE_DEVICES`` value, None for every GPU; see :func:`select_devices`).
    Empty where NVML is not installed or finds no GPU."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [nvml_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        indices, _ = select_devices(visible, uuids)
        return tuple(holder for i in indices for holder in _on(pynvml, i, handles[i]))
    finally:
        pynvml.nvmlShutdown()


def _on(nv: Any, index: int, handle: Any) -> list[GpuHolder]:
    found: dict[int, GpuHolder] = {}
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            processes = getattr(nv, query)(handle)
        except (nv.NVMLError, AttributeError):
            continue
        for proc in processes:
            used = getattr(proc, "usedGpuMemory", None)
            found.setdefault(proc.pid, GpuHolder(index, proc.pid, used if isinstance(used, int) else None, _command(proc.pid)))
    return list(found.values())


def _command(pid: int) -> str:
    """The holder's command line, with any API key in it masked."""
    try:
        return shown_command(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"


def wait_until_free(visible: Sequence[str | None], timeout_s: float | None = None, poll_s: float = 1.0) -> tuple[GpuHolder, ...]:
    """Poll :func:`holders` until there are none or ``timeout_s`` (default :data:`DRAIN_TIMEOUT_S`)
    passed; what still holds memory."""
    deadline = time.monotonic() + (DRAIN_TIMEOUT_S if timeout_s is None else timeout_s)
    while True:
        found = holders(visible)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)
