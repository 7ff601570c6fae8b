"""``qwenperf doctor``'s checks: whether this machine (a GPU runner, or a CPU machine) can run a suite
and give figures that are vLLM's, not the machine's.

Each check says ok, warn or fail, the figure it read and what to do. The GPUs at rest
(:mod:`.gpus`), a short load on them (:mod:`.load`), the CPU side (:mod:`.host`) and the
software (:mod:`.software`) are reported in that order; the steal time is read over the whole run.
"""

from __future__ import annotations

from pytest_qwenperf.serving.doctor.checks import DOCTOR_SCHEMA, Check, DoctorReport, Status
from pytest_qwenperf.serving.doctor.gpus import scan_gpus
from pytest_qwenperf.serving.doctor.host import cpu_times, host_checks
from pytest_qwenperf.serving.doctor.load import load_checks
from pytest_qwenperf.serving.doctor.options import DoctorOptions
from pytest_qwenperf.serving.doctor.software import software_checks
from pytest_qwenperf.serving.hardware import detect

__all__ = ["DOCTOR_SCHEMA", "Check", "DoctorOptions", "DoctorReport", "Status", "run_doctor"]


def run_doctor(options: DoctorOptions) -> DoctorReport:
    """Every check for ``options.suite`` on this machine. The load runs only where NVML found GPUs."""
    started = cpu_times()
    hw = detect()
    scan = scan_gpus(options.suite, hw)
    load = load_checks(scan, options) if scan.gpus else ()
    software = software_checks(options.suite)
    host = host_checks(options.suite, hw, started, options.limits)  # last: its steal time covers the whole run
    return DoctorReport(
        (*scan.checks, *load, *host, *software),
        suite=str(options.suite.path) if options.suite else None,
        machine=hw.machine(),
        machine_description=hw.describe(),
    )
