"""Which hardware this is: NVIDIA GPUs through NVML, otherwise the CPU from /proc.

The result decides which suites can run here (``b200`` needs B200s, ``cpu`` runs
anywhere) and is recorded with every result; nothing here asserts anything.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, replace
from functools import cache
from types import MappingProxyType

from pytest_qwenperf.core.machine import Machine
from pytest_qwenperf.telemetry.nvml import nvml_text

# NVML product names → suite hardware ids, most specific first.
_GPU_KINDS = (
    (re.compile(r"\bGB200\b"), "gb200"),
    (re.compile(r"\bGH200\b"), "gh200"),
    (re.compile(r"\bB200\b"), "b200"),
    (re.compile(r"\bH200\b"), "h200"),
    (re.compile(r"\bH100\b"), "h100"),
    (re.compile(r"\bA100\b"), "a100"),
    (re.compile(r"\bL40S\b"), "l40s"),
)


@dataclass(frozen=True)
class Hardware:
    """This machine as detected: what a run executes on (``kind`` is ``cpu`` or a GPU kind such as
    ``b200``), with what placing its processes needs (the CPUs it may use, their flags) beside the
    record results keep (:meth:`machine`)."""

    kind: str
    gpu_name: str | None = None
    gpu_count: int = 0
    driver: str | None = None
    cuda: str | None = None
    cpu_model: str = ""
    cpu_ids: frozenset[int] = frozenset()  # CPUs this process may run on
    cpu_flags: frozenset[str] = frozenset()  # /proc/cpuinfo flags (avx512f, amx_tile, ...)

    @property
    def cpu_count(self) -> int:
        return len(self.cpu_ids)

    @property
    def id(self) -> str:
        """What a baseline is tied to: the GPU family, or on CPU builds the CPU model and core
        count (a CPU figure says nothing about another CPU)."""
        if self.kind != "cpu":
            return self.kind
        return f"cpu-{_slug(self.cpu_model) or 'unknown'}-{self.cpu_count}c"

    def describe(self) -> str:
        if self.gpu_count:
            return f"{self.gpu_count}x {self.gpu_name} (driver {self.driver})"
        return f"CPU only: {self.cpu_model or 'unknown CPU'}, {self.cpu_count} cores"

    def machine(self) -> Machine:
        """The record every result keeps of this machine (:mod:`pytest_qwenperf.core.machine`)."""
        return Machine(
            kind=self.kind,
            id=self.id,
            gpu_name=self.gpu_name,
            gpu_count=self.gpu_count,
            driver=self.driver,
            cuda=self.cuda,
            cpu_model=self.cpu_model,
            cpu_count=self.cpu_count,
        )


GPU_FAMILIES = MappingProxyType({"hopper": ("h100", "h200", "gh200")})
"""Suite hardware that names a family: any of its GPU kinds runs the suite (runs and baselines
still carry the kind they ran on, and ``gpu_name`` tells an H100 run from an H200 one)."""


def satisfies(kind: str, wanted: str) -> bool:
    """Whether hardware of ``kind`` is what a suite asking for ``wanted`` (a kind or a family) needs."""
    return kind == wanted or kind in GPU_FAMILIES.get(wanted, ())


def hardware_name(wanted: str) -> str:
    """``h200`` → ``H200``; ``hopper`` → ``HOPPER (H100, H200 or GH200)``."""
    family = GPU_FAMILIES.get(wanted)
    return f"{wanted.upper()} ({', '.join(k.upper() for k in family[:-1])} or {family[-1].upper()})" if family else wanted.upper()


def gpu_kind(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` → ``"h100"``; unknown products get a slug of their name."""
    for pattern, kind in _GPU_KINDS:
        if pattern.search(name):
            return kind
    return _slug(name.lower().removeprefix("nvidia "))


def _slug(text: str) -> str:
    """Lower-case letters and digits, runs of anything else as one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@cache
def detect() -> Hardware:
    """The hardware of this machine (cached: it does not change during a session)."""
    model, flags = _cpu_info()
    cpu = Hardware(kind="cpu", cpu_model=model, cpu_ids=frozenset(os.sched_getaffinity(0)), cpu_flags=flags)
    gpus = _nvml_gpus()
    if gpus is None:
        return cpu
    names, driver, cuda = gpus
    return replace(
        cpu, kind=gpu_kind(names[0]), gpu_name=names[0], gpu_count=len(names), driver=driver, cuda=cuda
    )


def _nvml_gpus() -> tuple[list[str], str, str] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or no device
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        names = [nvml_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        return names, nvml_text(pynvml.nvmlSystemGetDriverVersion()), f"{cuda // 1000}.{cuda % 1000 // 10}"
    finally:
        pynvml.nvmlShutdown()



def _cpu_info() -> tuple[str, frozenset[str]]:
    """Model name and feature flags of the first CPU in /proc/cpuinfo."""
    model, flags = platform.processor(), frozenset[str]()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return model, flags
