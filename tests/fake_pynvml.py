"""A stand-in for the ``pynvml`` module (nvidia-ml-py) on machines without an NVIDIA GPU.

:func:`module` builds a fresh module object with the names the NVML sampler calls, the
same constants and the same exception hierarchy as nvidia-ml-py 13.x (``NVMLError(code)``
returns the subclass for that code, e.g. ``NVMLError_NotSupported``). Each GPU is a
:class:`FakeGpu` whose readings are scripted; tests put the module into ``sys.modules``
under the name ``pynvml`` so the real sampler code runs unchanged.

Readings that change over a run are scripted by poll: the poll number is how many times
the GPU's utilization was read (polls start with it), less one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import ClassVar

NVML_SUCCESS = 0
ERROR_CODES = {  # code → (constant suffix, class suffix, message) as in nvidia-ml-py
    1: ("UNINITIALIZED", "Uninitialized", "Uninitialized"),
    3: ("NOT_SUPPORTED", "NotSupported", "Not Supported"),
    10: ("TIMEOUT", "Timeout", "Timeout"),
    13: ("FUNCTION_NOT_FOUND", "FunctionNotFound", "Function Not Found"),
    15: ("GPU_IS_LOST", "GpuIsLost", "GPU is lost"),
    21: ("NO_DATA", "NoData", "No data"),
    999: ("UNKNOWN", "Unknown", "Unknown Error"),
}
GPM_METRIC_IDS = {"SM_UTIL": 2, "SM_OCCUPANCY": 3, "ANY_TENSOR_UTIL": 5}
GPM_METRIC_MAX = 477
EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError

Processes = Sequence[tuple[int, int | None]]  # (pid, bytes held or None: not accounted)


@dataclass
class FakeGpu:
    """One scripted GPU. A reading given as a sequence is indexed by the poll number (last value repeats)."""

    uuid: str
    name: str = "NVIDIA H200"
    utilization: int | Sequence[int] = 90  # percent, as NVML reports it
    memory_utilization: int = 40
    memory_used: int | Sequence[int] = 70 * 2**30
    power_mw: int = 500_000  # the energy counter grows at this rate in real time
    power_limit_mw: int = 700_000  # the enforced power limit
    default_power_limit_mw: int = 700_000  # the board's default limit (an H200 SXM's 700 W)
    sm_clock_mhz: int = 1980
    clock_events: int | Sequence[int] = 0
    gpm: dict[int, float] | None = field(default_factory=lambda: {2: 60.0, 3: 30.0, 5: 45.0})  # None: no GPM
    not_supported: frozenset[str] = frozenset()  # functions that raise NVMLError_NotSupported
    unknown_errors: dict[str, int] = field(default_factory=dict)  # function → first n calls raise NVMLError_Unknown
    lost_from_poll: int | None = None  # from this poll on (0-based; polls start with utilization) calls raise GpuIsLost
    processes: Processes | Callable[[int], Processes] = ()  # compute processes, or a function of the poll giving them
    xid_errors: Sequence[tuple[int, int]] = ()  # (poll, XID code) in poll order: waiting in the event sets from that poll on
    ecc_uncorrected: int | Sequence[int] = 0  # volatile counters
    ecc_corrected: int | Sequence[int] = 0
    # State at rest (``qwenperf doctor``); the defaults are a healthy H200 as read on one (driver 580.159.04)
    persistence_mode: int = 1  # NVML_FEATURE_ENABLED
    mig_mode: tuple[int, int] = (0, 0)  # (current, pending): NVML_DEVICE_MIG_DISABLE
    ecc_mode: tuple[int, int] = (1, 1)  # (current, pending): NVML_FEATURE_ENABLED
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # (corrected, uncorrected, pending, failure)
    retired_pages_pending: int | None = None  # None: NotSupported, as on Hopper (row remapping replaced it)
    temperature_c: int = 32
    slowdown_temperature_c: int = 87
    max_sm_clock_mhz: int = 1980
    pci_bus_id: str = "00000000:18:00.0"
    numa_node: int | None = None  # None: NotSupported, as on the H200 VM
    calls: Counter[str] = field(default_factory=Counter)
    energy_read_at: list[float] = field(default_factory=list)  # perf_counter of each energy reading that succeeded

    @property
    def polls(self) -> int:
        return self.calls["nvmlDeviceGetUtilizationRates"]

    def _enter(self, function: str, module: ModuleType, *, device: bool = True) -> int:
        """Count the call and raise what the script says; returns the poll index.

        ``device=False``: a call that does not reach the GPU (an event set's wait), so it works once the GPU is lost.
        """
        self.calls[function] += 1
        if device and self.lost_from_poll is not None and self.polls > self.lost_from_poll:
            raise module.NVMLError_GpuIsLost()
        if function in self.not_supported:
            raise module.NVMLError_NotSupported()
        if self.calls[function] <= self.unknown_errors.get(function, 0):
            raise module.NVMLError_Unknown()
        return max(self.polls - 1, 0)


def _at(value: int | Sequence[int], poll: int) -> int:
    if isinstance(value, int):
        return value
    return value[min(poll, len(value) - 1)]


class _EventSet:
    """Shaped like ``nvmlEventSet_t``: the GPUs registered, and how many of each one's events were taken."""

    def __init__(self) -> None:
        self.registered: list[tuple[FakeGpu, int]] = []  # (GPU, event type mask)
        self.taken: Counter[str] = Counter()  # GPU uuid → events delivered
        self.freed = False


def module(gpus: Sequence[FakeGpu], *, event_reasons_api: bool = True) -> ModuleType:
    """A fresh fake ``pynvml``; ``event_reasons_api=False`` mimics releases before ``…ClocksEventReasons``."""
    nv = ModuleType("pynvml")
    nv.NVML_SUCCESS = NVML_SUCCESS
    nv.NVML_CLOCK_SM = 1
    nv.NVML_GPM_METRICS_GET_VERSION = 1
    for name, metric_id in GPM_METRIC_IDS.items():
        setattr(nv, f"NVML_GPM_METRIC_{name}", metric_id)
    _add_errors(nv)
    nv.nvmlEventTypeXidCriticalError = EVENT_TYPE_XID
    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    nv.NVML_VOLATILE_ECC = 0
    nv.NVML_AGGREGATE_ECC = 1
    nv.NVML_FEATURE_DISABLED, nv.NVML_FEATURE_ENABLED = 0, 1
    nv.NVML_DEVICE_MIG_DISABLE, nv.NVML_DEVICE_MIG_ENABLE = 0, 1
    nv.NVML_TEMPERATURE_GPU = 0
    nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1
    state = SimpleNamespace(
        initialized=0,
        inits=0,
        shutdowns=0,
        allocated=0,
        freed=0,
        event_sets=0,
        event_sets_freed=0,
        started=time.perf_counter(),
    )
    nv.state = state

    def nvmlInit() -> None:
        state.initialized += 1
        state.inits += 1

    def nvmlShutdown() -> None:
        if not state.initialized:
            raise nv.NVMLError(1)
        state.initialized -= 1
        state.shutdowns += 1

    def checked(gpu: FakeGpu, function: str, *, device: bool = True) -> int:
        if not state.initialized:
            raise nv.NVMLError(1)
        return gpu._enter(function, nv, device=device)

    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> FakeGpu:
        return gpus[index]

    def nvmlDeviceGetUUID(gpu: FakeGpu) -> str:
        checked(gpu, "nvmlDeviceGetUUID")
        return gpu.uuid

    def nvmlDeviceGetName(gpu: FakeGpu) -> bytes:
        checked(gpu, "nvmlDeviceGetName")
        return gpu.name.encode()  # releases before 11.515 returned bytes

    def nvmlDeviceGetUtilizationRates(gpu: FakeGpu) -> SimpleNamespace:
        poll = checked(gpu, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=_at(gpu.utilization, poll), memory=gpu.memory_utilization)

    def nvmlDeviceGetMemoryInfo(gpu: FakeGpu) -> SimpleNamespace:
        poll = checked(gpu, "nvmlDeviceGetMemoryInfo")
        used = _at(gpu.memory_used, poll)
        return SimpleNamespace(total=141 * 2**30, used=used, free=141 * 2**30 - used)

    def nvmlDeviceGetComputeRunningProcesses(gpu: FakeGpu) -> list[SimpleNamespace]:
        poll = checked(gpu, "nvmlDeviceGetComputeRunningProcesses")
        listed = gpu.processes(poll) if callable(gpu.processes) else gpu.processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    def nvmlDeviceGetGraphicsRunningProcesses(gpu: FakeGpu) -> list[SimpleNamespace]:
        checked(gpu, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    def nvmlSystemGetDriverVersion() -> str:
        return "580.00.00"

    def nvmlSystemGetCudaDriverVersion_v2() -> int:
        return 13000

    def nvmlDeviceGetPowerUsage(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetPowerUsage")
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        return gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetPowerManagementDefaultLimit")
        return gpu.default_power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetTotalEnergyConsumption")
        gpu.energy_read_at.append(time.perf_counter())
        return 10**9 + int(gpu.power_mw * (gpu.energy_read_at[-1] - state.started))  # mW × s = mJ

    def nvmlDeviceGetClockInfo(gpu: FakeGpu, clock: int) -> int:
        checked(gpu, "nvmlDeviceGetClockInfo")
        assert clock == nv.NVML_CLOCK_SM
        return gpu.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(gpu: FakeGpu) -> int:
        return _at(gpu.clock_events, checked(gpu, "nvmlDeviceGetCurrentClocksEventReasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(gpu: FakeGpu) -> int:
        return _at(gpu.clock_events, checked(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons"))

    def nvmlDeviceGetTotalEccErrors(gpu: FakeGpu, error_type: int, counter_type: int) -> int:
        poll = checked(gpu, "nvmlDeviceGetTotalEccErrors")
        assert counter_type == nv.NVML_VOLATILE_ECC, "only the volatile counters are scripted"
        counts = {nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: gpu.ecc_uncorrected, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED: gpu.ecc_corrected}
        return _at(counts[error_type], poll)

    def nvmlDeviceGetPersistenceMode(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetPersistenceMode")
        return gpu.persistence_mode

    def nvmlDeviceGetMigMode(gpu: FakeGpu) -> list[int]:
        checked(gpu, "nvmlDeviceGetMigMode")
        return list(gpu.mig_mode)

    def nvmlDeviceGetEccMode(gpu: FakeGpu) -> list[int]:
        checked(gpu, "nvmlDeviceGetEccMode")
        return list(gpu.ecc_mode)

    def nvmlDeviceGetRemappedRows(gpu: FakeGpu) -> tuple[int, int, int, int]:
        checked(gpu, "nvmlDeviceGetRemappedRows")
        return gpu.remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetRetiredPagesPendingStatus")
        if gpu.retired_pages_pending is None:
            raise nv.NVMLError_NotSupported()
        return gpu.retired_pages_pending

    def nvmlDeviceGetTemperature(gpu: FakeGpu, sensor: int) -> int:
        checked(gpu, "nvmlDeviceGetTemperature")
        assert sensor == nv.NVML_TEMPERATURE_GPU
        return gpu.temperature_c

    def nvmlDeviceGetTemperatureThreshold(gpu: FakeGpu, threshold: int) -> int:
        checked(gpu, "nvmlDeviceGetTemperatureThreshold")
        assert threshold == nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, "only the slowdown threshold is scripted"
        return gpu.slowdown_temperature_c

    def nvmlDeviceGetMaxClockInfo(gpu: FakeGpu, clock: int) -> int:
        checked(gpu, "nvmlDeviceGetMaxClockInfo")
        assert clock == nv.NVML_CLOCK_SM
        return gpu.max_sm_clock_mhz

    def nvmlDeviceGetPciInfo(gpu: FakeGpu) -> SimpleNamespace:
        checked(gpu, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=gpu.pci_bus_id)

    def nvmlDeviceGetNumaNodeId(gpu: FakeGpu) -> int:
        checked(gpu, "nvmlDeviceGetNumaNodeId")
        if gpu.numa_node is None:
            raise nv.NVMLError_NotSupported()
        return gpu.numa_node

    def nvmlEventSetCreate() -> _EventSet:
        if not state.initialized:
            raise nv.NVMLError(1)
        state.event_sets += 1
        return _EventSet()

    def nvmlDeviceRegisterEvents(gpu: FakeGpu, event_types: int, event_set: _EventSet) -> None:
        checked(gpu, "nvmlDeviceRegisterEvents")
        event_set.registered.append((gpu, event_types))

    def nvmlEventSetWait_v2(event_set: _EventSet, timeoutms: int) -> SimpleNamespace:
        """The next event waiting in the set; never blocks: ``NVMLError_Timeout`` at once when there is none."""
        assert not event_set.freed
        for gpu, event_types in event_set.registered:
            poll = checked(gpu, "nvmlEventSetWait_v2", device=False)
            due = [code for at, code in gpu.xid_errors if at <= poll] if event_types & EVENT_TYPE_XID else []
            if len(due) > event_set.taken[gpu.uuid]:
                code = due[event_set.taken[gpu.uuid]]
                event_set.taken[gpu.uuid] += 1
                return SimpleNamespace(
                    device=gpu, eventType=EVENT_TYPE_XID, eventData=code, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
                )
        raise nv.NVMLError_Timeout()

    def nvmlEventSetFree(event_set: _EventSet) -> None:
        assert not event_set.freed, "an event set freed twice"
        event_set.freed = True
        state.event_sets_freed += 1

    def nvmlGpmQueryDeviceSupport(gpu: FakeGpu) -> SimpleNamespace:
        checked(gpu, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm is not None))

    def nvmlGpmSampleAlloc() -> SimpleNamespace:
        state.allocated += 1
        return SimpleNamespace(gpu=None, taken=0)

    def nvmlGpmSampleFree(sample: SimpleNamespace) -> None:
        state.freed += 1

    def nvmlGpmSampleGet(gpu: FakeGpu, sample: SimpleNamespace) -> SimpleNamespace:
        checked(gpu, "nvmlGpmSampleGet")
        sample.gpu, sample.taken = gpu, time.perf_counter()
        return sample

    def nvmlGpmMetricsGet(request: _MetricsGet) -> _MetricsGet:
        assert request.version == nv.NVML_GPM_METRICS_GET_VERSION
        first, second = request.sample1, request.sample2
        assert first is not second and first.gpu is second.gpu and first.taken < second.taken, "two samples, in order"
        gpu = second.gpu
        checked(gpu, "nvmlGpmMetricsGet")
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId in gpu.gpm:
                metric.nvmlReturn, metric.value = NVML_SUCCESS, gpu.gpm[metric.metricId]
            else:
                metric.nvmlReturn, metric.value = 3, 0.0
        return request

    functions = dict(locals())
    for name, function in functions.items():
        if name.startswith("nvml"):
            setattr(nv, name, function)
    if not event_reasons_api:
        del nv.nvmlDeviceGetCurrentClocksEventReasons
    nv.c_nvmlGpmMetricsGet_t = _MetricsGet
    return nv


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class _MetricsGet:
    """Shaped like ``c_nvmlGpmMetricsGet_t``: version, numMetrics, sample1/2 and a fixed metrics array."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: SimpleNamespace | None = None
        self.sample2: SimpleNamespace | None = None
        self.metrics = [_Metric() for _ in range(GPM_METRIC_MAX)]


def _add_errors(nv: ModuleType) -> None:
    """``NVMLError`` and one subclass per code, built the way nvidia-ml-py builds them."""
    messages = {code: message for code, (_, _, message) in ERROR_CODES.items()}

    class NVMLError(Exception):
        _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}

        def __new__(cls, value: int) -> NVMLError:
            subclass = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
            obj = Exception.__new__(subclass)
            obj.value = value
            return obj

        def __init__(self, *args: object) -> None:
            super().__init__()

        def __str__(self) -> str:
            return messages.get(self.value, f"NVML Error with code {self.value}")

    nv.NVMLError = NVMLError
    for code, (constant, suffix, _) in ERROR_CODES.items():
        setattr(nv, f"NVML_ERROR_{constant}", code)

        def new(cls: type[NVMLError], *args: object, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        subclass = type(f"NVMLError_{suffix}", (NVMLError,), {"__new__": new})
        setattr(nv, subclass.__name__, subclass)
        NVMLError._valClassMapping[code] = subclass
