"""The GPUs at rest, read through NVML: the states that make every figure of a run a figure of the machine.

A GPU power-capped below its default, in MIG mode, hot at idle, with rows waiting to be
remapped or with another process's memory on it measures slower for reasons no vLLM
release caused. Each state is read on every GPU; GPUs that read the same share a row.
``pynvml`` is imported here, when the check runs, so the package imports without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_qwenperf.core.validity import CLOCK_EVENTS
from pytest_qwenperf.serving.doctor.checks import Check, Reading, per_gpu
from pytest_qwenperf.serving.gpu_memory import GpuHolder, holders
from pytest_qwenperf.serving.hardware import Hardware, hardware_name
from pytest_qwenperf.serving.placement import missing_hardware
from pytest_qwenperf.suite.config import Suite
from pytest_qwenperf.telemetry.gpu_records import CLOCK_EVENT_REASONS
from pytest_qwenperf.telemetry.nvml import describe_error, nvml_text

GROUP = "gpu"
SYS = Path("/sys")
NEAR_SLOWDOWN_C = 10
"""Idle within this many degrees of the slowdown threshold: under load the GPU will reach it."""


@dataclass(frozen=True)
class Gpu:
    """What the load's report needs of one GPU."""

    index: int  # NVML's
    max_sm_clock_mhz: int | None  # None: not readable


@dataclass(frozen=True)
class GpuScan:
    """The GPUs found (none: no NVIDIA GPU here), the processes holding memory on them, and the checks."""

    gpus: tuple[Gpu, ...]
    holders: tuple[GpuHolder, ...]
    checks: tuple[Check, ...]


def scan_gpus(suite: Suite | None, hw: Hardware) -> GpuScan:
    """Every check of the GPUs at rest; ``hw`` is this machine (:func:`~pytest_qwenperf.serving.hardware.detect`)."""
    try:
        import pynvml
    except ImportError:
        return _no_gpu(suite, "pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return _no_gpu(suite, f"NVML could not start: {exc}")
    try:
        count = pynvml.nvmlDeviceGetCount()
        if not count:
            return _no_gpu(suite, "NVML lists no GPU")
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        checks = [_driver(hw), _model(suite, hw)]
        for name, read in _READINGS:
            checks += per_gpu(GROUP, name, ((i, _reading(pynvml, read, h)) for i, h in enumerate(handles)))
        gpus = tuple(Gpu(i, _max_sm_clock(pynvml, h)) for i, h in enumerate(handles))
    finally:
        pynvml.nvmlShutdown()
    found = holders([None])
    return GpuScan(gpus, found, (*checks, _holders(found)))


def _no_gpu(suite: Suite | None, why: str) -> GpuScan:
    if suite is not None and suite.gpus:
        advice = f"run suite {suite.name} on a machine with {suite.gpus}x {hardware_name(suite.hardware)} GPUs and nvidia-ml-py installed"
        return GpuScan((), (), (Check(GROUP, "no NVIDIA GPU found", "fail", why, advice),))
    return GpuScan((), (), (Check(GROUP, "no NVIDIA GPU found", "ok", f"{why}: CPU checks only"),))


def _driver(hw: Hardware) -> Check:
    """The GPUs, driver and CUDA versions as hardware detection read them through NVML."""
    count = hw.gpu_count
    figure = f"{count} GPU{'s' if count > 1 else ''}, driver {hw.driver}, CUDA {hw.cuda}"
    return Check(GROUP, "NVML", "ok", figure)


def _model(suite: Suite | None, hw: Hardware) -> Check:
    """GPU model and count against the suite's hardware, as the session decides it (``missing_hardware``)."""
    found = f"{hw.gpu_count}x {hw.gpu_name} (kind {hw.kind})"
    if suite is None:
        return Check(GROUP, "GPU model and count", "ok", found)
    if not suite.gpus:
        return Check(GROUP, "GPU model and count", "ok", f"{found}; suite {suite.name} needs no GPU")
    missing = missing_hardware(suite, suite.configs[0], hw)
    if missing:
        advice = f"run suite {suite.name} on {suite.gpus}x {hardware_name(suite.hardware)}, or a suite for {hw.gpu_count}x {hw.kind} here"
        return Check(GROUP, "GPU model and count", "fail", missing, advice)
    return Check(
        GROUP, "GPU model and count", "ok", f"{found}; suite {suite.name} needs {suite.gpus}x {hardware_name(suite.hardware)}"
    )


def _reading(nv: Any, read: Callable[[Any, Any], Reading], handle: Any) -> Reading:
    """One state of one GPU; an NVML error (a driver without the call included) makes it a warning."""
    try:
        return read(nv, handle)
    except (nv.NVMLError, AttributeError) as exc:
        return Reading("warn", f"not readable: {describe_error(exc)}")


def _persistence(nv: Any, h: Any) -> Reading:
    if nv.nvmlDeviceGetPersistenceMode(h) == nv.NVML_FEATURE_ENABLED:
        return Reading("ok", "on")
    return Reading(
        "warn",
        "off: the driver tears the GPU down whenever no process holds it, so every boot pays its start again",
        "nvidia-smi -pm 1 (or run nvidia-persistenced)",
    )


def _mig(nv: Any, h: Any) -> Reading:
    try:
        current, pending = nv.nvmlDeviceGetMigMode(h)
    except nv.NVMLError_NotSupported:
        return Reading("ok", "not supported by this GPU")
    if current == nv.NVML_DEVICE_MIG_ENABLE:
        return Reading(
            "fail", "enabled: the suite's servers would see a MIG partition, not the GPU", "nvidia-smi -mig 0, then reset the GPU"
        )
    if pending == nv.NVML_DEVICE_MIG_ENABLE:
        return Reading("warn", "disabled, but enabled at the next GPU reset", "nvidia-smi -mig 0")
    return Reading("ok", "disabled")


def _ecc(nv: Any, h: Any) -> Reading:
    try:
        current, _ = nv.nvmlDeviceGetEccMode(h)
    except nv.NVMLError_NotSupported:
        return Reading("ok", "not supported by this GPU")
    if current == nv.NVML_FEATURE_ENABLED:
        return Reading("ok", "on")
    return Reading(
        "warn",
        "off: memory errors go unseen, and the figures are not those of a GPU run with ECC (as in production)",
        "nvidia-smi -e 1, then reset the GPU",
    )


def _retired_memory(nv: Any, h: Any) -> Reading:
    """Row remapping (Ampere and newer), else page retirement (older GPUs; NotSupported on an H200)."""
    try:
        corrected, uncorrected, pending, failure = nv.nvmlDeviceGetRemappedRows(h)
    except (nv.NVMLError_NotSupported, AttributeError):
        return _retired_pages(nv, h)
    if failure:
        return Reading(
            "fail", "row remapping: a remap failed, the memory has no spare rows left", "take the GPU out of service (RMA)"
        )
    if pending:
        return Reading(
            "fail", "row remapping: rows wait for a remap that takes a GPU reset", "reset the GPU (nvidia-smi -r) before running"
        )
    if uncorrected:
        return Reading(
            "warn",
            f"row remapping: {uncorrected} rows remapped after uncorrectable errors ({corrected} after correctable ones)",
            "watch the count: a GPU that keeps losing rows fails; report it to the vendor",
        )
    return Reading("ok", f"row remapping: {corrected} rows remapped after correctable errors, none after uncorrectable ones")


def _retired_pages(nv: Any, h: Any) -> Reading:
    try:
        pending = nv.nvmlDeviceGetRetiredPagesPendingStatus(h)
    except (nv.NVMLError_NotSupported, AttributeError):
        return Reading("warn", "not readable: neither row remapping nor page retirement is supported")
    if pending == nv.NVML_FEATURE_ENABLED:
        return Reading(
            "fail",
            "page retirement: pages wait for retirement at the next GPU reset",
            "reset the GPU (nvidia-smi -r) before running",
        )
    return Reading("ok", "page retirement: none pending")


def _power_limit(nv: Any, h: Any) -> Reading:
    enforced = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
    default = nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000
    if enforced < default:
        return Reading(
            "fail",
            f"power-capped at {enforced:.0f} W of its default {default:.0f} W: every figure measured is a figure of the cap",
            f"nvidia-smi -pl {default:.0f}",
        )
    return Reading("ok", f"{enforced:.0f} W" + (" (the default)" if enforced == default else f" (default {default:.0f} W)"))


def _temperature(nv: Any, h: Any) -> Reading:
    now = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    try:
        slowdown = nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    except nv.NVMLError_NotSupported:
        return Reading("ok", f"{now} °C at idle (slowdown threshold not readable)")
    if now >= slowdown:
        return Reading(
            "fail", f"{now} °C at idle, at or above its slowdown threshold {slowdown} °C", "fix the cooling before measuring"
        )
    if now >= slowdown - NEAR_SLOWDOWN_C:
        return Reading(
            "warn",
            f"{now} °C at idle, within {NEAR_SLOWDOWN_C} °C of its slowdown threshold {slowdown} °C: under load it will slow down",
            "check the cooling and the airflow",
        )
    return Reading("ok", f"{now} °C at idle (slowdown at {slowdown} °C)")


def _idle_clock_events(nv: Any, h: Any) -> Reading:
    """At idle a healthy GPU reports ``gpu_idle`` or nothing (an H200 read mask 0x1, and 0 in other runs);
    a slowdown with no load is a fault."""
    mask = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    reasons = [reason for bit, reason in CLOCK_EVENT_REASONS.items() if mask & bit]
    held = [reason for reason in reasons if reason in CLOCK_EVENTS]
    if held:
        return Reading(
            "fail",
            f"{', '.join(held)} at idle: a slowdown with no load is a machine fault",
            "look at cooling, power supply and nvidia-smi -q -d PERFORMANCE",
        )
    return Reading("ok", ", ".join(reasons) or "none")


def _gpm(nv: Any, h: Any) -> Reading:
    if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
        return Reading("ok", "supported: SM and tensor activity are measured")
    return Reading(
        "warn",
        "not supported: SM and tensor activity unavailable; GPU utilization alone reads 100 % for one tiny kernel",
        "judge GPU use by throughput, not by utilization",
    )


def _numa_node(nv: Any, h: Any) -> Reading:
    """NVML's node where it says (NotSupported on the H200 VM), else the PCI device's in sysfs (-1 there)."""
    try:
        node = int(nv.nvmlDeviceGetNumaNodeId(h))
    except (nv.NVMLError, AttributeError):
        node = _sysfs_numa_node(nvml_text(nv.nvmlDeviceGetPciInfo(h).busId))
    return Reading("ok", f"node {node}" if node >= 0 else "unknown (single node or not exposed)")


def _sysfs_numa_node(bus_id: str) -> int:
    """NVML's ``00000000:18:00.0`` is sysfs's ``0000:18:00.0``; -1 where the kernel does not say."""
    domain, _, rest = bus_id.partition(":")
    try:
        path = SYS / "bus" / "pci" / "devices" / f"{int(domain, 16):04x}:{rest.lower()}" / "numa_node"
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return -1


_READINGS: tuple[tuple[str, Callable[[Any, Any], Reading]], ...] = (
    ("persistence mode", _persistence),
    ("MIG mode", _mig),
    ("ECC mode", _ecc),
    ("retired memory", _retired_memory),
    ("power limit", _power_limit),
    ("temperature", _temperature),
    ("clock events at idle", _idle_clock_events),
    ("GPM", _gpm),
    ("NUMA node", _numa_node),
)


def _max_sm_clock(nv: Any, h: Any) -> int | None:
    try:
        return int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM))
    except (nv.NVMLError, AttributeError):
        return None


def _holders(found: tuple[GpuHolder, ...]) -> Check:
    if not found:
        return Check(GROUP, "other processes", "ok", "none holds GPU memory")
    return Check(
        GROUP,
        "other processes",
        "fail",
        "; ".join(holder.describe() for holder in found),
        "stop them: a session refuses to boot on a GPU another process holds memory on",
        gpus=tuple(sorted({holder.gpu for holder in found})),
    )
