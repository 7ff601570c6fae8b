"""The CPU side: frequency governor, SMT, steal time while the doctor ran, and the client's cores.

On the GPU VM the checks were written against (a Firecracker VM with one H200), cpufreq is
not exposed at all: the hypervisor owns the frequency, and the guest cannot set it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.core.options import format_cpu_list
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.serving.doctor.checks import STATUSES, Check, Status
from pytest_qwenperf.serving.hardware import Hardware
from pytest_qwenperf.serving.placement import placement
from pytest_qwenperf.suite.config import Suite
from pytest_qwenperf.telemetry.cores import CoreTimes, core_times

GROUP = "cpu"
SYS = Path("/sys")


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU times (every CPU), and when they were read."""

    times: CoreTimes
    at: float  # time.monotonic()


def cpu_times() -> CpuTimes | None:
    """None where ``/proc/stat`` cannot be read."""
    try:
        return CpuTimes(core_times(), time.monotonic())
    except OSError:
        return None


def host_checks(suite: Suite | None, hw: Hardware, since: CpuTimes | None, limits: ValidityLimits) -> tuple[Check, ...]:
    """``since``: the CPU times when the doctor started; steal is measured from then to now."""
    checks = [_governor(), _smt(), _steal(since, cpu_times(), limits)]
    if suite is not None:
        checks.append(_client_cores(suite, hw))
    return tuple(checks)


def _governor() -> Check:
    governors = Counter(
        path.read_text().strip() for path in sorted(SYS.glob("devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"))
    )
    if not governors:
        return Check(GROUP, "CPU governor", "ok", "not exposed (virtual machine?)")
    shown = ", ".join(f"{governor} on {n} CPUs" for governor, n in governors.items())
    if governors["powersave"]:
        advice = "cpupower frequency-set -g performance"
        return Check(GROUP, "CPU governor", "warn", f"{shown}: powersave clocks the CPUs down between requests", advice)
    return Check(GROUP, "CPU governor", "ok", shown)


def _smt() -> Check:
    try:
        active = (SYS / "devices/system/cpu/smt/active").read_text().strip()
    except OSError:
        return Check(GROUP, "SMT", "ok", "not exposed")
    if active == "1":
        return Check(GROUP, "SMT", "ok", "on: two hardware threads share each core, and pinned CPUs may be siblings")
    return Check(GROUP, "SMT", "ok", "off")


def _steal(since: CpuTimes | None, now: CpuTimes | None, limits: ValidityLimits) -> Check:
    """The hypervisor's share of this machine's CPU time while the doctor ran, against the suite's ``steal_share``."""
    if since is None or now is None or since.times.steal_s is None or now.times.steal_s is None:
        return Check(GROUP, "steal time", "ok", "not readable (/proc/stat)")
    if now.times.total_s <= since.times.total_s:
        return Check(GROUP, "steal time", "ok", "not measurable: the run took less than a clock tick")
    share = (now.times.steal_s - since.times.steal_s) / (now.times.total_s - since.times.total_s)
    figure = f"{share:.1%} of the CPU time over {now.at - since.at:.0f} s (the suite's limit {limits.steal_share:.0%})"
    values = {"steal_share": share, "steal_share_limit": limits.steal_share}
    if share > limits.steal_share:
        advice = "a shared VM: runs here would be invalid (cpu-steal); use a dedicated host or a VM with dedicated cores"
        return Check(GROUP, "steal time", "warn", figure, advice, values=values)
    return Check(GROUP, "steal time", "ok", figure, values=values)


def _client_cores(suite: Suite, hw: Hardware) -> Check:
    """The CPUs the load generator has to itself under the suite's placement, for the config that leaves the fewest.

    The CPU build's servers get every CPU but the last, the client the last (``placement``).
    With only as many CPUs as replicas, placement gives each replica one and lets the client
    share them: a figure of that config is noisier (warn). With a single server and no CPU
    for the client, no figure of the suite is the server's alone (fail). GPU servers are not
    pinned; the client shares the CPUs with their API processes.
    """
    rows = []
    for cfg in suite.configs:
        where = placement(cfg, hw)
        if where.client_cpus:
            left = len(where.client_cpus)
            figure = f"config {cfg.id}: client on CPU {format_cpu_list(where.client_cpus)}, servers on {format_cpu_list(where.server_cpus)}"
        elif suite.gpus and not where.server_cpus:
            left = hw.cpu_count
            figure = (
                f"config {cfg.id}: GPU servers, nothing pinned; the client shares {hw.cpu_count} CPUs with their API processes"
            )
        else:
            left = len(hw.cpu_ids - where.server_cpus) if where.server_cpus else 0
            figure = f"config {cfg.id}: {cfg.replicas} server(s) on {hw.cpu_count} CPUs leave the client none of its own"
        status: Status = "ok" if left else "warn" if cfg.replicas > 1 else "fail"
        rows.append((STATUSES.index(status), -left, status, left, figure))
    _, _, status, left, figure = max(rows)  # the worst config: its status first, then the fewest CPUs
    shown = f"{left} CPU{'' if left == 1 else 's'} for the load generator ({figure})"
    if status == "ok":
        return Check(GROUP, "client cores", "ok", shown)
    advice = "use a machine with more CPUs than servers, or pin them: --qwenperf-server-cpus / --qwenperf-client-cpus"
    if status == "warn":
        shown += ": placement lets it share the replicas' CPUs, so that config's figures are noisier"
    return Check(GROUP, "client cores", status, shown, advice)
