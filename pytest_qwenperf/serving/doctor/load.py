"""A short load on every GPU: whether NVML sees this namespace's pids, and what the GPUs do at full load.

One child process (:mod:`.child`) holds memory on every GPU and runs bf16 matrix products on
all of them while the project's NVML sampler reads the GPUs, as it does during a run. Two
questions are answered:

* **PID visibility.** The run's ``gpu-shared`` condition tells the run's own processes from
  others by pid. NVML reports pids of the host's PID namespace; inside a container without
  it, the servers' pids never match the ones NVML lists. The child's pid is looked for among
  the GPU's processes.
* **The GPUs under load.** Utilization, SM and tensor activity, power against the enforced
  limit, the SM clock and the clock events over the load's steady part: the figures a suite's
  ``[suite.validity]`` limits are set from. An H200 (driver 580.159.04) under 15 s of these
  products: utilization 99.95 %, SM activity 96.4 %, tensor activity 93.6 %, 691 W of its
  700 W limit, SM clock 1481 MHz on average (max 1980), ``sw_power_cap`` in every sample: a
  healthy GPU at full load sits at its power limit, so only a limit lowered below the
  default makes the power cap hold it back (``GpuDeviceSummary.held_back_share``). This
  check's own child on an H200 VM (driver 580.159.04): utilization 99.2 to 99.5 %, SM
  activity 95 %, tensor activity 92 %, 691 W, SM clock 1480 MHz on average (min 1395), and
  NVML listed the child's own pid holding about 1,000 MiB.

The child is started under the package's process guard, so it dies with the doctor.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.serving.doctor.checks import Check
from pytest_qwenperf.serving.doctor.gpus import GpuScan
from pytest_qwenperf.serving.doctor.options import DoctorOptions
from pytest_qwenperf.serving.proctree import new_tag, spawn_tree, stop_tree, tree_of
from pytest_qwenperf.telemetry.gpu_records import GpuDeviceSummary, others_held
from pytest_qwenperf.telemetry.nvml import NvmlSampler
from pytest_qwenperf.telemetry.sampling import CLOCK, Stats

GROUP = "load"
PID_GROUP = "pid"
INTERVAL_S = 0.1
PROCESSES_EVERY_S = 0.5
WARMUP_S = 2.0
"""The start of the load left out of its figures (clocks and power ramp up); at most half the load."""
MIN_UTILIZATION = 0.9
"""Under a plain matrix load a GPU is busy all the time (an H200: 99.2 to 99.95 %); less means it is throttled or shared."""
READY_TIMEOUT_S = 120.0
"""How long the child may take to import torch and hold memory on every GPU."""
DONE_SLACK_S = 60.0
STOP_GRACE_S = 5.0
_POLL_S = 0.05
_UNAVAILABLE = "unavailable:"


@dataclass(frozen=True)
class _ChildRun:
    """When the child said ``ready`` and ``done`` (sampler clock), and why it did not (None: it did)."""

    ready_at: float | None
    done_at: float | None
    problem: str | None


def load_checks(scan: GpuScan, options: DoctorOptions) -> tuple[Check, ...]:
    """The PID visibility check and, unless ``options.load_seconds`` is 0, one load row per GPU."""
    with tempfile.TemporaryDirectory(prefix="qwenperf-doctor-") as folder:
        log, tag = Path(folder) / "child.log", new_tag()
        child = spawn_tree([*options.child, f"{options.load_seconds:g}"], log_path=log, env={}, tag=tag)
        own: set[int] = set()

        def own_pids() -> set[int]:
            own.update(p.pid for p in tree_of(child.pid, tag))
            return own

        sampler = NvmlSampler(
            [os.environ.get("CUDA_VISIBLE_DEVICES")],
            interval_s=INTERVAL_S,
            own_pids=own_pids,
            processes_every_s=PROCESSES_EVERY_S,
        ).start()
        try:
            run = _follow(child, log, options.load_seconds)
            own_pids()
        finally:
            sampler.stop()
            stop_tree(child, tag, grace=STOP_GRACE_S)
    if sampler.unavailable:
        run = _ChildRun(None, None, f"NVML sampler: {sampler.unavailable}")
    if run.ready_at is None:
        return _not_run(run.problem or "", options.load_seconds)
    visibility = _visibility(_listed(sampler, run.ready_at), own, {h.pid for h in scan.holders})
    if not options.load_seconds:
        return (visibility,)
    if run.done_at is None:
        return visibility, Check(GROUP, "under load", "warn", f"not measured: {run.problem}")
    skip = min(WARMUP_S, options.load_seconds / 2)
    summary = sampler.summary((run.ready_at + skip, run.done_at))
    max_clocks = {gpu.index: gpu.max_sm_clock_mhz for gpu in scan.gpus}
    return visibility, *(_under_load(d, max_clocks.get(d.device.index), options.limits) for d in summary.devices)


def _not_run(problem: str, load_seconds: float) -> tuple[Check, ...]:
    """Both checks as warnings, when the child never held memory (no torch with CUDA, or it failed)."""
    why, advice = problem, ""
    if problem.startswith(_UNAVAILABLE):
        why, advice = (
            f"needs torch with CUDA: {problem.removeprefix(_UNAVAILABLE).strip()}",
            "install torch with CUDA in this Python",
        )
    visibility = Check(PID_GROUP, "PID visibility", "warn", f"not checked ({why})", advice)
    return (visibility, Check(GROUP, "under load", "warn", f"not run ({why})", advice)) if load_seconds else (visibility,)


def _follow(child: Popen[bytes], log: Path, seconds: float) -> _ChildRun:
    ready = _wait_for(child, log, "ready", READY_TIMEOUT_S)
    if isinstance(ready, str):
        return _ChildRun(None, None, ready)
    done = _wait_for(child, log, "done", seconds + DONE_SLACK_S)
    return _ChildRun(ready, None, done) if isinstance(done, str) else _ChildRun(ready, done, None)


def _wait_for(child: Popen[bytes], log: Path, word: str, timeout_s: float) -> float | str:
    """When the child wrote ``word`` on a line of its own (sampler clock), or why it will not."""
    deadline = CLOCK() + timeout_s
    while True:
        exited = child.poll() is not None  # before reading: a line written just before exiting is seen
        lines = log.read_text(errors="replace").splitlines()
        if word in lines:
            return CLOCK()
        said = next((line for line in lines if line.startswith(_UNAVAILABLE)), None)
        if said:
            return said
        if exited:
            tail = lines[-1] if lines else "no output"
            return f"the CUDA child exited with status {child.returncode} before it said {word!r}: {tail}"
        if CLOCK() > deadline:
            return f"the CUDA child did not say {word!r} within {timeout_s:.0f} s"
        time.sleep(_POLL_S)


def _listed(sampler: NvmlSampler, since: float) -> dict[int, int | None]:
    """Every pid NVML listed on a sampled GPU from ``since`` on, with the most memory it was seen holding."""
    readings = [
        sample.processes
        for device in sampler.devices
        for sample in sampler.samples(device.uuid)
        if sample.at >= since and sample.processes
    ]
    return others_held(readings, own=())


def _visibility(listed: Mapping[int, int | None], own: set[int], before: set[int]) -> Check:
    """``before``: processes that held memory before the child started (reported by the GPU checks)."""
    mine = {pid: used for pid, used in listed.items() if pid in own}
    if mine:
        shown = ", ".join(f"pid {pid} with {_mib(used)}" for pid, used in mine.items())
        figure = f"NVML listed this check's process ({shown}): it reports this namespace's pids, so gpu-shared names the processes that share a GPU"
        return Check(PID_GROUP, "PID visibility", "ok", figure)
    strangers = sorted(set(listed) - own - before)
    if strangers:
        figure = (
            f"NVML reports host pids (a container without the host PID namespace): it listed pid {', '.join(map(str, strangers))}, "
            f"not this check's {', '.join(map(str, sorted(own)))}. Another process on the GPU is still detected, but it cannot be "
            "told from the run's own by pid, so gpu-shared would take the run's own servers for other processes"
        )
        return Check(
            PID_GROUP,
            "PID visibility",
            "warn",
            figure,
            "run the container with the host's PID namespace (docker --pid=host, Kubernetes hostPID: true)",
        )
    return Check(
        PID_GROUP,
        "PID visibility",
        "warn",
        "NVML listed no process while this check's child held memory: another process sharing a GPU would go unseen (gpu-shared)",
        "check by hand that nothing else runs on the GPUs (the driver or the virtual GPU keeps no per-process accounting)",
    )


def _under_load(d: GpuDeviceSummary, max_clock_mhz: int | None, limits: ValidityLimits) -> Check:
    utilization = _mean(d.utilization)
    held_back = d.held_back_share()
    figure = ", ".join(
        (
            f"utilization {_percent(utilization)}",
            f"SM activity {_percent(_mean(d.sm_activity))}",
            f"tensor activity {_percent(_mean(d.tensor_activity))}",
            _power(d),
            _clock(d.sm_clock_mhz, max_clock_mhz),
            "clock events " + (", ".join(f"{reason} {share:.0%}" for reason, share in d.clock_events.items()) or "none"),
            f"held back {_percent(held_back)} (limit {limits.clock_event_share:.0%})",
        )
    )
    values = {
        "samples": d.samples,
        "utilization": utilization,
        "sm_activity": _mean(d.sm_activity),
        "tensor_activity": _mean(d.tensor_activity),
        "power_w": _mean(d.power_w),
        "power_limit_w": d.power_limit_w,
        "default_power_limit_w": d.default_power_limit_w,
        "sm_clock_mhz": _mean(d.sm_clock_mhz),
        "min_sm_clock_mhz": d.sm_clock_mhz.min if d.sm_clock_mhz else None,
        "max_sm_clock_mhz": max_clock_mhz,
        "clock_events": dict(d.clock_events),
        "held_back_share": held_back,
        "clock_event_share_limit": limits.clock_event_share,
    }
    faults = []
    if utilization is not None and utilization < MIN_UTILIZATION:
        faults.append(
            f"under {MIN_UTILIZATION:.0%} busy under a plain matrix load: something else throttles the GPU or shares it"
        )
    if held_back is not None and held_back > limits.clock_event_share:
        reasons = ", ".join(sorted(r for r in d.held_back_reasons() if d.clock_events.get(r)))
        faults.append(
            f"held below its clocks by {reasons} beyond the suite's limit: every run here would be invalid (gpu-clock-events)"
        )
        if (limit := d.lowered_power_limit) is not None:
            faults.append(f"raise the power limit: nvidia-smi -pl {limit[1]:.0f}")
    if faults:
        return Check(GROUP, "under load", "fail", figure, "; ".join(faults), gpus=(d.device.index,), values=values)
    if utilization is None or held_back is None:
        advice = "utilization or clock events were not read: the figures are incomplete"
        return Check(GROUP, "under load", "warn", figure, advice, gpus=(d.device.index,), values=values)
    return Check(GROUP, "under load", "ok", figure, gpus=(d.device.index,), values=values)


def _power(d: GpuDeviceSummary) -> str:
    power = _mean(d.power_w)
    if power is None:
        return "power not read"
    if not d.power_limit_w:
        return f"{power:.0f} W"
    return f"{power:.0f} W ({power / d.power_limit_w:.0%} of its {d.power_limit_w:.0f} W limit)"


def _clock(clock: Stats | None, max_clock_mhz: int | None) -> str:
    if clock is None:
        return "SM clock not read"
    top = f", max {max_clock_mhz}" if max_clock_mhz is not None else ""
    return f"SM clock {clock.mean:.0f} MHz (min {clock.min:.0f}{top})"


def _mean(stats: Stats | None) -> float | None:
    return stats.mean if stats else None


def _percent(share: float | None) -> str:
    return "not read" if share is None else f"{share:.1%}"


def _mib(used: int | None) -> str:
    return "memory not reported" if used is None else f"{used / 2**20:,.0f} MiB"
