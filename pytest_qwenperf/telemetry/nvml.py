"""GPU telemetry through NVML (``pynvml`` from nvidia-ml-py), sampled while the load runs.

Per GPU and poll: kernel-busy time and memory-controller busy time
(``nvmlDeviceGetUtilizationRates``), and, where the device supports GPU Performance
Monitoring (Hopper and newer), the share of SMs busy, SM occupancy and tensor-pipe activity
between two GPM samples. "GPU utilization" alone reads 100 % while one tiny kernel runs;
SM and tensor activity say how much of the chip did work. Also memory used, power,
the cumulative energy counter (→ joules per run, tokens per joule), SM clock and
clock-event (throttle) reasons.

Also the evidence that a run's GPU was not the GPU it claims: XID errors (NVML's critical
error events, drained at each poll), the volatile ECC error counters, processes outside
the run holding memory on the GPU (read every few seconds; the caller says which
processes are the run's own), and the enforced and default power limits (read once), which
tell a GPU at its own power limit from one capped below it.

What it records, and the summaries over a window, are :mod:`~pytest_qwenperf.telemetry.gpu_records`;
which GPUs a run's servers see, :mod:`~pytest_qwenperf.telemetry.gpu_select`.

``pynvml`` is imported when sampling starts, so this module imports on machines without
it. NVML errors are recorded per device and field and never end the run: a field the
device does not support, or that keeps failing, is marked unavailable and no longer
polled; a GPU that falls off the bus (``GPU is lost``) stops being polled at all.

Kept as one module though over 400 lines: it is one sampler and the NVML calls it makes;
what it records and the summaries are already elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

import psutil

from pytest_qwenperf.telemetry.gpu_records import (
    FieldHealth,
    GpuDevice,
    GpuDeviceSummary,
    GpuSample,
    GpuSummary,
    bracket,
    errors_counted,
    event_shares,
    others_held,
)
from pytest_qwenperf.telemetry.gpu_select import select_devices
from pytest_qwenperf.telemetry.sampling import (
    CLOCK,
    PeriodicSampler,
    SamplerUnavailable,
    Stats,
    Window,
    counter_increase,
    inside,
)

DEFAULT_INTERVAL_S = 0.1
PROCESSES_EVERY_S = 2.0
"""Listing a GPU's processes is slower than the other readings, and a process that holds memory
holds it for seconds: they are read every this often, and at the closing poll."""
GIVE_UP_AFTER = 5
"""Consecutive failures after which a field is marked unavailable (not-supported: at once)."""

FIELDS = (
    "utilization",
    "memory_used",
    "power",
    "energy",
    "sm_clock",
    "clock_events",
    "gpm",
    "xid_errors",
    "ecc_uncorrected",
    "ecc_corrected",
    "processes",
)
GPM_FIELDS = ("sm_activity", "sm_occupancy", "tensor_activity")

# --- the sampler -----------------------------------------------------------------------


class _DeviceLost(Exception):
    pass


@dataclass
class _FieldState:
    errors: int = 0
    consecutive: int = 0
    unavailable: bool = False
    last_error: str | None = None


@dataclass
class _DeviceState:
    """Mutable per-GPU state, touched only by the sampler thread (and by open/close)."""

    info: GpuDevice
    handle: Any
    fields: dict[str, _FieldState] = field(default_factory=lambda: {f: _FieldState() for f in FIELDS + GPM_FIELDS})
    samples: list[GpuSample] = field(default_factory=list)
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, next]
    gpm_request: Any = None  # a reusable c_nvmlGpmMetricsGet_t
    gpm_primed: bool = False  # whether ``gpm_samples[0]`` holds a sample yet
    event_set: Any = None  # the nvmlEventSet_t its XID errors arrive in
    power_limits_w: tuple[float | None, float | None] = (None, None)  # (enforced, default) when opened
    xid_drains: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)  # (when, XID codes) per drain
    lost: bool = False


class NvmlSampler(PeriodicSampler):
    """Samples the GPUs named by the replicas' ``CUDA_VISIBLE_DEVICES`` values."""

    def __init__(
        self,
        visible_devices: Sequence[str | None],
        interval_s: float = DEFAULT_INTERVAL_S,
        give_up_after: int = GIVE_UP_AFTER,
        own_pids: Callable[[], Collection[int]] | None = None,
        processes_every_s: float = PROCESSES_EVERY_S,
    ) -> None:
        """``own_pids``: the run's processes now (the server trees), called from the sampler
        thread each time the GPUs' processes are read; any other process seen holding memory
        on a sampled GPU is reported. None: every process is the run's own, none is read."""
        super().__init__(interval_s)
        self.visible_devices = tuple(visible_devices)
        self.give_up_after = give_up_after
        self.own_pids = own_pids
        self.processes_every_s = processes_every_s
        self.unresolved_devices: tuple[str, ...] = ()
        self._nv: ModuleType | None = None
        self._devices: list[_DeviceState] = []
        self._own: set[int] = set()  # every pid own_pids() ever returned: a process is the run's own for the whole run
        self._process_names: dict[int, str | None] = {}  # None: could not be read
        self._processes_read_at = float("-inf")

    @property
    def devices(self) -> tuple[GpuDevice, ...]:
        return tuple(d.info for d in self._devices)

    def samples(self, uuid: str) -> tuple[GpuSample, ...]:
        """The time series of one GPU (complete once the sampler is stopped)."""
        for device in self._devices:
            if device.info.uuid == uuid:
                return tuple(device.samples)
        raise KeyError(f"GPU {uuid} is not sampled")

    # lifecycle -----------------------------------------------------------------------
    def _open(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise SamplerUnavailable("pynvml is not installed (pip install nvidia-ml-py)") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise SamplerUnavailable(f"NVML could not start: {exc}") from exc
        self._nv = pynvml
        try:
            every = self._all_devices()
            uuids = [device[0].uuid if device else None for device in every]
            chosen, self.unresolved_devices = select_devices(self.visible_devices, uuids)
            self._devices = [_DeviceState(*found) for i in chosen if (found := every[i])]
            if not self._devices:
                raise SamplerUnavailable(f"no GPU here matches CUDA_VISIBLE_DEVICES {list(self.visible_devices)}")
            for device in self._devices:
                self._open_gpm(device)
                self._open_events(device)
                device.power_limits_w = _power_limits(pynvml, device.handle)
        except pynvml.NVMLError as exc:
            self._close()
            raise SamplerUnavailable(f"NVML could not list the GPUs: {exc}") from exc
        except BaseException:
            self._close()
            raise

    def _all_devices(self) -> list[tuple[GpuDevice, Any] | None]:
        """Every NVML device with its handle; None for one that cannot be read (already lost)."""
        nv = self._nvml
        found: list[tuple[GpuDevice, Any] | None] = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid, name = nvml_text(nv.nvmlDeviceGetUUID(handle)), nvml_text(nv.nvmlDeviceGetName(handle))
                found.append((GpuDevice(index, uuid, name), handle))
            except nv.NVMLError:
                found.append(None)
        return found

    def _open_gpm(self, device: _DeviceState) -> None:
        """Allocate two GPM samples and one metrics request, or mark GPM unavailable."""
        nv = self._nvml
        try:
            if not nv.nvmlGpmQueryDeviceSupport(device.handle).isSupportedDevice:
                _unavailable(device, ("gpm", *GPM_FIELDS), "GPM not supported on this GPU")
                return
            for _ in range(2):
                device.gpm_samples.append(nv.nvmlGpmSampleAlloc())
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            ids = (nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_SM_OCCUPANCY, nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
            request.numMetrics = len(ids)
            for slot, metric_id in enumerate(ids):
                request.metrics[slot].metricId = metric_id
            device.gpm_request = request
        except (AttributeError, nv.NVMLError) as exc:  # a pynvml before GPM, or the driver refused
            _unavailable(device, ("gpm", *GPM_FIELDS), describe_error(exc))

    def _open_events(self, device: _DeviceState) -> None:
        """Register for the GPU's XID errors, or mark them unavailable (a driver or GPU without events)."""
        nv = self._nvml
        try:
            device.event_set = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(device.handle, nv.nvmlEventTypeXidCriticalError, device.event_set)
        except (AttributeError, nv.NVMLError) as exc:
            _unavailable(device, ("xid_errors",), describe_error(exc))
            self._free_events(device)

    def _free_events(self, device: _DeviceState) -> None:
        nv = self._nvml
        if device.event_set is not None:
            with contextlib.suppress(nv.NVMLError):  # as for GPM samples: NVML reclaims it at shutdown
                nv.nvmlEventSetFree(device.event_set)
            device.event_set = None

    def _close(self) -> None:
        nv = self._nv
        if nv is None:
            return
        for device in self._devices:
            self._free_events(device)
            for sample in device.gpm_samples:
                with contextlib.suppress(nv.NVMLError):  # a lost GPU's samples cannot be freed; NVML reclaims them at shutdown
                    nv.nvmlGpmSampleFree(sample)
            device.gpm_samples = []
        self._nv = None
        nv.nvmlShutdown()

    @property
    def _nvml(self) -> Any:
        assert self._nv is not None, "NVML used outside start()/stop()"
        return self._nv

    # polling -------------------------------------------------------------------------
    def _poll(self) -> None:
        own_pids = self.own_pids
        processes = own_pids is not None and (
            self._stopping.is_set() or CLOCK() - self._processes_read_at >= self.processes_every_s
        )
        if processes:
            self._processes_read_at = CLOCK()
        for device in self._devices:
            if device.lost:
                continue
            try:
                device.samples.append(self._read(device, processes))
            except _DeviceLost:
                device.lost = True
            try:  # also in the poll that found the GPU lost: the XID that says why (79) is waiting
                self._field(device, "xid_errors", functools.partial(self._drain_xid_errors, device))
            except _DeviceLost:
                device.lost = True
        if processes and own_pids is not None:
            self._own.update(own_pids())  # after the GPUs' lists: a process in them is in the trees by now

    def _read(self, device: _DeviceState, processes: bool) -> GpuSample:
        nv, h = self._nvml, device.handle
        at = CLOCK()
        util = self._field(device, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        memory = self._field(device, "memory_used", lambda: nv.nvmlDeviceGetMemoryInfo(h).used)
        power = self._field(device, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        gpm = self._field(device, "gpm", lambda: self._gpm(device)) or {}
        return GpuSample(
            at=at,
            utilization=util.gpu / 100 if util is not None else None,
            memory_utilization=util.memory / 100 if util is not None else None,
            sm_activity=gpm.get("sm_activity"),
            sm_occupancy=gpm.get("sm_occupancy"),
            tensor_activity=gpm.get("tensor_activity"),
            memory_used_bytes=memory,
            power_w=power / 1000 if power is not None else None,
            energy_mj=self._field(device, "energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
            sm_clock_mhz=self._field(device, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            clock_events=self._field(device, "clock_events", lambda: _clock_event_reasons(nv, h)),
            ecc_uncorrected=self._field(
                device, "ecc_uncorrected", lambda: _ecc_errors(nv, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
            ),
            ecc_corrected=self._field(device, "ecc_corrected", lambda: _ecc_errors(nv, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED)),
            processes=self._field(device, "processes", lambda: self._processes(h)) if processes else None,
        )

    def _drain_xid_errors(self, device: _DeviceState) -> None:
        """Take every XID error waiting in the GPU's event set (without waiting for more)."""
        nv = self._nvml
        at, codes = CLOCK(), []
        try:
            with contextlib.suppress(nv.NVMLError_Timeout):  # raised once none is left
                while True:
                    event = nv.nvmlEventSetWait_v2(device.event_set, 0)
                    if event.eventType == nv.nvmlEventTypeXidCriticalError:
                        codes.append(int(event.eventData))
        finally:  # the codes taken before an error are kept
            device.xid_drains.append((at, tuple(codes)))

    def _processes(self, handle: Any) -> Mapping[int, int | None]:
        """Processes with memory on the GPU: pid → bytes held (None where the driver does not say)."""
        nv = self._nvml
        found = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
        with contextlib.suppress(nv.NVMLError_NotSupported):  # a GPU without a graphics engine lists only compute
            found += nv.nvmlDeviceGetGraphicsRunningProcesses(handle)
        held: dict[int, int | None] = {}
        for process in found:  # one with both kinds of context is listed twice, with the same memory
            held[process.pid] = process.usedGpuMemory if process.usedGpuMemory is not None else held.get(process.pid)
            if process.pid not in self._process_names:
                self._process_names[process.pid] = _process_name(process.pid)
        return MappingProxyType(held)

    def _gpm(self, device: _DeviceState) -> dict[str, float | None]:
        """Take a GPM sample; metrics between it and the previous one (none on the first poll)."""
        nv = self._nvml
        previous, current = device.gpm_samples
        nv.nvmlGpmSampleGet(device.handle, current)
        values: dict[str, float | None] = {}
        try:
            if device.gpm_primed:
                request = device.gpm_request
                request.sample1, request.sample2 = previous, current
                nv.nvmlGpmMetricsGet(request)
                for slot, name in enumerate(GPM_FIELDS):
                    metric = request.metrics[slot]
                    if metric.nvmlReturn == nv.NVML_SUCCESS:
                        values[name] = metric.value / 100
                        device.fields[name].consecutive = 0
                    elif not device.fields[name].unavailable:
                        self._record_error(device, name, nv.NVMLError(metric.nvmlReturn))
        finally:
            device.gpm_samples = [current, previous]
            device.gpm_primed = True
        return values

    def _field(self, device: _DeviceState, name: str, read: Callable[[], Any]) -> Any:
        state = device.fields[name]
        if state.unavailable:
            return None
        try:
            value = read()
        except _DeviceLost:
            raise
        except Exception as exc:  # NVML errors, and older pynvml versions missing a function
            self._record_error(device, name, exc)
            return None
        state.consecutive = 0
        return value

    def _record_error(self, device: _DeviceState, name: str, exc: Exception) -> None:
        nv = self._nvml
        state = device.fields[name]
        state.errors += 1
        state.consecutive += 1
        state.last_error = describe_error(exc)
        if isinstance(exc, nv.NVMLError_GpuIsLost):
            raise _DeviceLost from exc
        permanent = isinstance(exc, (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound, AttributeError))
        if permanent or state.consecutive >= self.give_up_after:
            state.unavailable = True

    # results -------------------------------------------------------------------------
    def summary(self, window: Window | None = None, tokens: int | None = None) -> GpuSummary:
        """Per-GPU statistics of the samples inside ``window`` (all samples when None).

        Energy and ECC errors are over ``window``, or over the span all GPUs were sampled: a
        GPU whose counter stopped early (lost, or the field gave up) has no figure. XID and ECC
        errors and processes come from the readings that bracket the window (:func:`_bracket`).
        A process is the run's own if ``own_pids`` ever returned it, even after it was listed.
        """
        span = window or _span(self._devices)
        own, names = frozenset(self._own), dict(self._process_names)
        return GpuSummary(
            devices=tuple(_device_summary(d, window, span, self.interval_s, own, names) for d in self._devices),
            unresolved_devices=self.unresolved_devices,
            tokens=tokens,
            health=self.health(),
        )


def _unavailable(device: _DeviceState, names: Sequence[str], reason: str) -> None:
    """Mark fields unavailable from the start: they are not polled."""
    for name in names:
        state = device.fields[name]
        state.unavailable, state.last_error = True, reason


def _span(devices: Sequence[_DeviceState]) -> Window | None:
    sampled = [d.samples for d in devices if d.samples]
    return (min(s[0].at for s in sampled), max(s[-1].at for s in sampled)) if sampled else None


def _device_summary(
    device: _DeviceState,
    window: Window | None,
    span: Window | None,
    slack: float,
    own: Collection[int],
    names: Mapping[int, str | None],
) -> GpuDeviceSummary:
    """``slack``: GPUs are read one after another, so their samples of one poll differ by up to a poll's length.
    ``own``: the run's processes; ``names``: process names by pid (None: unreadable)."""
    samples = [s for s in device.samples if inside(s.at, window)]

    def stats(name: str) -> Stats | None:
        return Stats.of(getattr(s, name) for s in samples)

    energy = [(s.at, float(s.energy_mj)) for s in device.samples if s.energy_mj is not None]
    increase = counter_increase(energy, span, slack) if span else None
    events = [s.clock_events for s in samples if s.clock_events is not None]
    memory = [s.memory_used_bytes for s in samples if s.memory_used_bytes is not None]
    uncorrected = [(s.at, s.ecc_uncorrected) for s in device.samples if s.ecc_uncorrected is not None]
    corrected = [(s.at, s.ecc_corrected) for s in device.samples if s.ecc_corrected is not None]
    first, last = bracket([at for at, _ in device.xid_drains], window)
    xids = tuple(code for _, codes in device.xid_drains[first + 1 : last + 1] for code in codes)
    listed = [(s.at, s.processes) for s in device.samples if s.processes is not None]
    first, last = bracket([at for at, _ in listed], window)
    held = others_held([processes for _, processes in listed[max(first, 0) : last + 1]], own)
    return GpuDeviceSummary(
        device=device.info,
        samples=len(samples),
        utilization=stats("utilization"),
        memory_utilization=stats("memory_utilization"),
        sm_activity=stats("sm_activity"),
        sm_occupancy=stats("sm_occupancy"),
        tensor_activity=stats("tensor_activity"),
        power_w=stats("power_w"),
        sm_clock_mhz=stats("sm_clock_mhz"),
        peak_memory_used_bytes=max(memory) if memory else None,
        energy_j=increase / 1000 if increase is not None else None,
        clock_events=event_shares(events),
        clock_event_masks=MappingProxyType(dict(Counter(events))),
        xid_errors=xids,
        ecc_uncorrected=errors_counted(uncorrected, span, slack),
        ecc_corrected=errors_counted(corrected, span, slack),
        other_processes=MappingProxyType(held),
        other_process_names=MappingProxyType({pid: name for pid in held if (name := names.get(pid))}),
        field_errors=MappingProxyType(
            {
                name: FieldHealth(state.errors, state.unavailable, state.last_error)
                for name, state in device.fields.items()
                if state.errors or state.unavailable
            }
        ),
        lost=device.lost,
        power_limit_w=device.power_limits_w[0],
        default_power_limit_w=device.power_limits_w[1],
    )


def _ecc_errors(nv: Any, handle: Any, error_type: int) -> int:
    """ECC errors of ``error_type`` counted since the driver loaded (the volatile counter)."""
    return int(nv.nvmlDeviceGetTotalEccErrors(handle, error_type, nv.NVML_VOLATILE_ECC))


def _power_limits(nv: Any, handle: Any) -> tuple[float | None, float | None]:
    """The enforced and the default power limit in watts; None where NVML cannot read one."""

    def watts(read: Callable[[], int]) -> float | None:
        try:
            return read() / 1000
        except (nv.NVMLError, AttributeError):
            return None

    return (
        watts(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle)),
        watts(lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(handle)),
    )


def _process_name(pid: int) -> str | None:
    """None for a process that is gone, not ours to read, or in another PID namespace (a container)."""
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


def _clock_event_reasons(nv: Any, handle: Any) -> int:
    """Called ``…ClocksEventReasons`` since driver 535; older pynvml and drivers know only ``…ThrottleReasons``."""
    try:
        return int(nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except (AttributeError, nv.NVMLError_FunctionNotFound):
        return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def describe_error(exc: BaseException) -> str:
    """An NVML error (or another) as one message: its text, else its type's name."""
    return str(exc) or type(exc).__name__


def nvml_text(value: str | bytes) -> str:
    """A string NVML returned: ``bytes`` from older nvidia-ml-py releases, ``str`` from newer ones."""
    return value.decode() if isinstance(value, bytes) else value
