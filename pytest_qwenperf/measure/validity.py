"""Whether a load run's device was the device it claims: the conditions that make a run invalid.

Read from the run's telemetry over its steady-state window and judged against the suite's
:class:`~pytest_qwenperf.core.validity.ValidityLimits`. Each wrong condition is a
:class:`~pytest_qwenperf.core.run.Loss` the run carries (``Run.conditions``), which the gate
turns into ``invalid: <reason>`` for every metric of the run.
"""

from __future__ import annotations

from pytest_qwenperf.core.run import Loss
from pytest_qwenperf.core.validity import CONTENDED_CORES, ValidityLimits
from pytest_qwenperf.telemetry import TelemetrySummary
from pytest_qwenperf.telemetry.cpu import CpuSummary, ServerCoresSummary
from pytest_qwenperf.telemetry.gpu_records import GpuSummary


def conditions(telemetry: TelemetrySummary, limits: ValidityLimits) -> tuple[Loss, ...]:
    """Every condition of the run that was wrong; empty when none was (or none was observed)."""
    found: list[Loss] = []
    if telemetry.cpu is not None and telemetry.cpu.server_cores is not None:
        found += _cores(telemetry.cpu.server_cores, limits)
        found += _off_cores(telemetry.cpu)
    if telemetry.gpu is not None:
        found += _gpus(telemetry.gpu, limits)
    return tuple(found)


def _cores(cores: ServerCoresSummary, limits: ValidityLimits) -> list[Loss]:
    found = []
    listed = ",".join(map(str, cores.cores))
    where = f"server core {listed} was" if len(cores.cores) == 1 else f"server cores {listed} were"
    if cores.contended_share is not None and cores.contended_share > limits.contended_share:
        named = ", ".join(f"pid {o.pid} ({o.name}) {o.cores_busy:.2f} cores" for o in cores.busiest_other_processes)
        found.append(
            Loss(
                reason="cpu-contention",
                detail=(
                    f"{where} shared with other busy processes (at least {CONTENDED_CORES} cores, the cores full) for "
                    f"{cores.contended_share:.0%} of the steady state (limit {limits.contended_share:.0%})"
                    + (f"; busiest: {named}" if named else "")
                ),
            )
        )
    if cores.steal_share is not None and cores.steal_share > limits.steal_share:
        detail = f"{where} {cores.steal_share:.0%} stolen by the hypervisor (steal time; limit {limits.steal_share:.0%})"
        found.append(Loss(reason="cpu-steal", detail=detail))
    return found


OFF_CORES_SLACK = 0.1
"""Cores a server's tree may read busy beyond its cores' count before it counts as running elsewhere:
a sampled interval's CPU times and wall time are read a little apart."""


def _off_cores(cpu: CpuSummary) -> list[Loss]:
    """A server tree busier than its cores can make it ran threads elsewhere: on the load generator's
    cores, where no other-process check looks (they are the server's own threads). Seen when a
    server booted on the client's core and was moved onto its own: a thread it started later ran
    on the first core again (1.69 cores busy on one, benchmarks/README.md, "The price of a verdict")."""
    server, cores = cpu.groups.get("server"), cpu.server_cores
    if server is None or server.cores_busy is None or cores is None:
        return []
    allowed = len(cores.cores) * (1 + OFF_CORES_SLACK)
    if server.cores_busy.mean <= allowed:
        return []
    listed = ",".join(map(str, cores.cores))
    return [
        Loss(
            reason="server-off-cores",
            detail=(
                f"the server's processes kept {server.cores_busy.mean:.2f} cores busy on average, more than its "
                f"{len(cores.cores)} core(s) ({listed}) can give: some of its threads ran on other cores"
            ),
        )
    ]


def _gpus(gpu: GpuSummary, limits: ValidityLimits) -> list[Loss]:
    found = []
    share = gpu.held_back_share()
    if share is not None and share > limits.clock_event_share:
        active = sorted({r for d in gpu.devices for r, s in d.clock_events.items() if r in d.held_back_reasons() and s > 0})
        capped = [
            f"GPU {d.device.label} power limit {limit[0]:.0f} W of its default {limit[1]:.0f} W"
            for d in gpu.devices
            if (limit := d.lowered_power_limit) is not None
        ]
        detail = (
            f"GPUs were held below their clocks ({', '.join(active)}) for {share:.0%} of the steady state "
            f"(limit {limits.clock_event_share:.0%})" + (f"; {'; '.join(capped)}" if capped else "")
        )
        found.append(Loss(reason="gpu-clock-events", detail=detail))
    xids = gpu.xid_errors()
    if xids:
        shown = "; ".join(f"GPU {label}: XID {', '.join(map(str, codes))}" for label, codes in xids.items())
        found.append(Loss(reason="gpu-xid", detail=f"GPUs logged XID errors during the run ({shown})"))
    ecc = gpu.ecc_uncorrected()
    if ecc:
        shown = "; ".join(f"GPU {label}: {count}" for label, count in ecc.items())
        found.append(Loss(reason="gpu-ecc", detail=f"GPUs counted uncorrected ECC errors during the run ({shown})"))
    others = gpu.other_processes()
    if others:
        shown = "; ".join(
            f"GPU {label}: " + ", ".join(f"pid {pid} ({_mib(used)})" for pid, used in held.items())
            for label, held in others.items()
        )
        found.append(Loss(reason="gpu-shared", detail=f"GPUs held memory of other processes ({shown})"))
    return found


def _mib(used: int | None) -> str:
    return "memory not reported" if used is None else f"{used / 2**20:,.0f} MiB"
