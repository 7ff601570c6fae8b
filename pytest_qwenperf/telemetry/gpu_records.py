"""What the NVML sampler records of each GPU, and its summaries over a window.

A sample per GPU and poll (:class:`GpuSample`), each GPU over a window (:class:`GpuDeviceSummary`)
and every sampled GPU with totals (:class:`GpuSummary`), with the arithmetic of windows they rest
on: clock-event shares, error counters bracketed by the readings around a window, and processes
other than the run's own. The sampler that fills them is :mod:`pytest_qwenperf.telemetry.nvml`.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from pytest_qwenperf.core.validity import CLOCK_EVENTS, POWER_CAP
from pytest_qwenperf.telemetry.sampling import SamplerHealth, Stats, Window

# nvmlClocksEventReason* bits (nvml.h; the same bits were called ThrottleReason before driver 535)
CLOCK_EVENT_REASONS: Mapping[int, str] = MappingProxyType(
    {
        0x1: "gpu_idle",
        0x2: "applications_clocks_setting",
        0x4: "sw_power_cap",
        0x8: "hw_slowdown",
        0x10: "sync_boost",
        0x20: "sw_thermal_slowdown",
        0x40: "hw_thermal_slowdown",
        0x80: "hw_power_brake_slowdown",
        0x100: "display_clock_setting",
    }
)


@dataclass(frozen=True)
class GpuDevice:
    """One GPU, by NVML index (PCI bus order) and UUID."""

    index: int
    uuid: str
    name: str

    @property
    def label(self) -> str:
        """How a GPU is named in messages: its NVML index (the JSON's ``devices`` pair it with the UUID)."""
        return str(self.index)


@dataclass(frozen=True)
class GpuSample:
    """One poll of one GPU; fractions are of 1, None where the field could not be read."""

    at: float  # perf_counter seconds
    utilization: float | None = None  # time a kernel was running
    memory_utilization: float | None = None  # time device memory was read or written
    sm_activity: float | None = None  # GPM: SMs busy, since the previous poll
    sm_occupancy: float | None = None  # GPM: resident warps / theoretical maximum
    tensor_activity: float | None = None  # GPM: time SMs ran any tensor instruction
    memory_used_bytes: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None  # cumulative since the driver loaded
    sm_clock_mhz: int | None = None
    clock_events: int | None = None  # nvmlClocksEventReason bit mask
    ecc_uncorrected: int | None = None  # volatile counter: since the driver loaded
    ecc_corrected: int | None = None
    processes: Mapping[int, int | None] | None = None  # pid → bytes held (None: not reported); None: not read this poll


@dataclass(frozen=True)
class FieldHealth:
    """Errors one field of one GPU had; ``unavailable`` once it was given up on."""

    errors: int
    unavailable: bool
    last_error: str | None

    def as_json(self) -> dict[str, object]:
        return {"errors": self.errors, "unavailable": self.unavailable, "last_error": self.last_error}


@dataclass(frozen=True)
class GpuDeviceSummary:
    """One GPU over a window."""

    device: GpuDevice
    samples: int
    utilization: Stats | None
    memory_utilization: Stats | None
    sm_activity: Stats | None
    sm_occupancy: Stats | None
    tensor_activity: Stats | None
    power_w: Stats | None
    sm_clock_mhz: Stats | None
    peak_memory_used_bytes: int | None
    energy_j: float | None  # None unless the energy counter covers the whole window
    clock_events: Mapping[str, float]  # reason → share of samples it was active in
    clock_event_masks: Mapping[int, int]  # bit mask → samples it was read in (shares of any set of reasons)
    xid_errors: tuple[int, ...]  # XID codes the GPU reported in the window, in order
    ecc_uncorrected: int | None  # errors counted in the window; None: not read (ECC off) or not over all of it
    ecc_corrected: int | None
    other_processes: Mapping[int, int | None]  # pid → most bytes seen held (None: never reported), not the run's own
    other_process_names: Mapping[int, str]  # of those, the ones whose name could be read
    field_errors: Mapping[str, FieldHealth]  # only fields that had errors
    lost: bool
    power_limit_w: float | None = None  # enforced when the sampler opened; None: not readable
    default_power_limit_w: float | None = None

    @property
    def power_capped(self) -> bool:
        """Whether the GPU's power limit was lowered below its default, or cannot be told (limits unreadable).

        A healthy GPU at full load sits at its own power limit: on an H200 (driver 580.159.04) 15 s of
        bf16 matrix products drew 691 W of 700 W with ``sw_power_cap`` set in every sample. That is the
        GPU working as built; a limit below the default is a machine that was set up to run slower.
        """
        if self.power_limit_w is None or self.default_power_limit_w is None:
            return True
        return self.lowered_power_limit is not None

    @property
    def lowered_power_limit(self) -> tuple[float, float] | None:
        """``(enforced, default)`` watts where both were read and the limit is below the default; else None."""
        enforced, default = self.power_limit_w, self.default_power_limit_w
        return (enforced, default) if enforced is not None and default is not None and enforced < default else None

    def held_back_reasons(self) -> frozenset[str]:
        """The clock-event reasons that make this GPU's samples held back: :data:`CLOCK_EVENTS`, the power
        cap only where :attr:`power_capped`."""
        return frozenset(r for r in CLOCK_EVENTS if r != POWER_CAP or self.power_capped)

    def held_back_share(self) -> float | None:
        """Share of the samples held below the GPU's clocks by a fault (:meth:`held_back_reasons`)."""
        return self.clock_event_share(self.held_back_reasons())

    def clock_event_share(self, reasons: Collection[str]) -> float | None:
        """Share of the samples in which any of ``reasons`` was active; None when no sample read clock events.

        Not the sum of the reasons' shares: reasons often come together (a power cap and a
        thermal slowdown in the same sample), and a sample held back is held back once.
        """
        bits = _clock_event_bits(reasons)
        read = sum(self.clock_event_masks.values())
        return sum(n for mask, n in self.clock_event_masks.items() if mask & bits) / read if read else None

    def as_json(self) -> dict[str, object]:
        def stats(s: Stats | None) -> dict[str, float | int] | None:
            return s.as_json() if s else None

        return {
            "index": self.device.index,
            "uuid": self.device.uuid,
            "name": self.device.name,
            "samples": self.samples,
            "lost": self.lost,
            "utilization": stats(self.utilization),
            "memory_utilization": stats(self.memory_utilization),
            "sm_activity": stats(self.sm_activity),
            "sm_occupancy": stats(self.sm_occupancy),
            "tensor_activity": stats(self.tensor_activity),
            "power_w": stats(self.power_w),
            "sm_clock_mhz": stats(self.sm_clock_mhz),
            "peak_memory_used_bytes": self.peak_memory_used_bytes,
            "power_limit_w": self.power_limit_w,
            "default_power_limit_w": self.default_power_limit_w,
            "energy_j": self.energy_j,
            "clock_events": dict(self.clock_events),
            "xid_errors": list(self.xid_errors),
            "ecc_uncorrected": self.ecc_uncorrected,
            "ecc_corrected": self.ecc_corrected,
            "foreign_processes": [  # other_processes, under the key stored sessions have
                {"pid": pid, "used_bytes": used, "name": self.other_process_names.get(pid)}
                for pid, used in self.other_processes.items()
            ],
            "field_errors": {name: health.as_json() for name, health in self.field_errors.items()},
        }


@dataclass(frozen=True)
class GpuSummary:
    """Every sampled GPU over a window, with totals across them."""

    devices: tuple[GpuDeviceSummary, ...]
    unresolved_devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries that name no GPU here
    tokens: int | None
    health: SamplerHealth

    @property
    def energy_j(self) -> float | None:
        """Energy of all GPUs; None if any GPU's is unknown (a partial sum would flatter tokens/J)."""
        parts = [d.energy_j for d in self.devices]
        return None if not parts or any(p is None for p in parts) else sum(p for p in parts if p is not None)

    @property
    def tokens_per_joule(self) -> float | None:
        energy = self.energy_j
        return None if self.tokens is None or not energy else self.tokens / energy

    def clock_event_share(self, reasons: Collection[str]) -> float | None:
        """The largest share, over GPUs, of samples in which any of ``reasons`` was active.

        The largest, not the mean: one GPU held back slows every step of a tensor-parallel
        model. None when no GPU read clock events.
        """
        shares = [share for d in self.devices if (share := d.clock_event_share(reasons)) is not None]
        return max(shares) if shares else None

    def held_back_share(self) -> float | None:
        """The largest share, over GPUs, of samples held back by a fault (:meth:`GpuDeviceSummary.held_back_share`)."""
        shares = [share for d in self.devices if (share := d.held_back_share()) is not None]
        return max(shares) if shares else None

    def xid_errors(self) -> dict[str, tuple[int, ...]]:
        """XID codes per GPU (by :attr:`GpuDevice.label`), for the GPUs that reported any in the window."""
        return {d.device.label: d.xid_errors for d in self.devices if d.xid_errors}

    def ecc_uncorrected(self) -> dict[str, int]:
        """Uncorrected ECC errors per GPU (by :attr:`GpuDevice.label`), for the GPUs that counted any in the window."""
        return {d.device.label: d.ecc_uncorrected for d in self.devices if d.ecc_uncorrected}

    def other_processes(self) -> dict[str, Mapping[int, int | None]]:
        """Other processes' memory per GPU (by :attr:`GpuDevice.label`), for the GPUs that had any in the window."""
        return {d.device.label: d.other_processes for d in self.devices if d.other_processes}

    def mean_of(self, name: str) -> float | None:
        """Mean over GPUs of each GPU's mean ``name`` (``utilization``, ``sm_activity``, ...)."""
        means = [stats.mean for d in self.devices if (stats := getattr(d, name)) is not None]
        return statistics.fmean(means) if means else None

    def as_json(self) -> dict[str, object]:
        return {
            "utilization_mean": self.mean_of("utilization"),
            "sm_activity_mean": self.mean_of("sm_activity"),
            "tensor_activity_mean": self.mean_of("tensor_activity"),
            "energy_j": self.energy_j,
            "tokens": self.tokens,
            "tokens_per_joule": self.tokens_per_joule,
            "devices": [d.as_json() for d in self.devices],
            "unresolved_devices": list(self.unresolved_devices),
            "sampler": self.health.as_json(),
        }


def event_shares(masks: Sequence[int]) -> Mapping[str, float]:
    """Share of the samples in which each clock-event reason was active (reasons never seen left out)."""
    shares = {reason: sum(1 for m in masks if m & bit) / len(masks) for bit, reason in CLOCK_EVENT_REASONS.items()} if masks else {}
    return MappingProxyType({reason: share for reason, share in shares.items() if share})


def _clock_event_bits(reasons: Collection[str]) -> int:
    """The mask of named clock-event reasons; a name NVML does not have is an error, not a share of 0."""
    bits = {reason: bit for bit, reason in CLOCK_EVENT_REASONS.items()}
    unknown = set(reasons) - bits.keys()
    if unknown:
        raise ValueError(f"unknown clock-event reasons {sorted(unknown)}; known: {', '.join(bits)}")
    return sum(bits[reason] for reason in set(reasons))


def bracket(times: Sequence[float], window: Window | None) -> tuple[int, int]:
    """Indices of the readings that bracket ``window``: the last at or before its start (-1: none)
    and the first at or after its end (the last reading: none); ``(-1, last)`` without a window.

    Readings are taken at intervals, so what happened at a window's edge is told by the reading
    just outside it: errors counted or events drained by the first reading after them, a process
    that held memory across the start by the last reading before it.
    """
    if window is None:
        return -1, len(times) - 1
    return bisect.bisect_right(times, window[0]) - 1, min(bisect.bisect_left(times, window[1]), len(times) - 1)


def errors_counted(points: Sequence[tuple[float, int]], span: Window | None, slack: float) -> int | None:
    """How much an error counter grew over ``span``, from the reading before it to the one after it.

    Not interpolated as energy is: an error counted between two readings may have happened
    anywhere between them, and half an error is none. None when the readings miss more than
    ``slack`` at either end of the span, as for energy.
    """
    if span is None or len(points) < 2 or span[0] < points[0][0] - slack or span[1] > points[-1][0] + slack:
        return None
    first, last = bracket([at for at, _ in points], span)
    return points[last][1] - points[max(first, 0)][1]


def others_held(listed: Sequence[Mapping[int, int | None]], own: Collection[int]) -> dict[int, int | None]:
    """pid → the most bytes it was seen holding, for every listed process that is not the run's own."""
    held: dict[int, int | None] = {}
    for processes in listed:
        for pid, used in processes.items():
            if pid not in own:
                held[pid] = max((b for b in (held.get(pid), used) if b is not None), default=None)
    return held
