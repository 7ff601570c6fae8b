"""Load runs as pytest-benchmark entries, so its storage, JSON and comparisons work on them.

pytest-benchmark times a Python callable; a load run is measured by our own client. The
measured values reach it through the fixture's ``pedantic()`` mode, one round per repeat
of the run, with a timer that reads back those values instead of a clock. Everything else
(``--benchmark-autosave``, ``--benchmark-json``, ``--benchmark-compare-fail``,
``pytest-benchmark compare``) then treats them like any timing.

pytest-benchmark compares time statistics only, and "higher is worse"; so the recorded
statistic is *seconds per fixed unit of work* (by default seconds per 1,000,000 total
tokens, ``1e6 / total_token_throughput``), and ``--benchmark-compare-fail=median:5%``
fails when the median throughput drops by about 5 %.

Registered as a plugin, the module also puts the GPU, CPU and vLLM version into
pytest-benchmark's ``machine_info`` (its storage folder name ignores the GPU) and warns
loudly when a run is compared with one measured on other hardware.

Its table stays on the terminal, saying what it holds: a run's group is
``<suite/config>: seconds per million total tokens (lower is better)`` (:data:`GROUP_UNIT`), and
the figures of a table of such groups stay in seconds (:func:`pytest_benchmark_scale_unit`), where
pytest-benchmark would rescale them to ms and call them "time". Keeping the table off the terminal
instead would mean forcing its ``--benchmark-quiet`` on, which also hides its own lines (where it
saved a run, what it compared against) and takes an option from its users; a group's name and the
unit hook are public, change nothing in the JSON or storage but the group's label (comparisons
match on ``fullname``), and keep the table for those who read it (``--benchmark-quiet`` still hides it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import pytest

from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.metrics import METRICS
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.suite.vllm_args import installed_vllm

UNIT = "seconds per 1,000,000 total tokens (1e6 / total_token_throughput)"
GROUP_UNIT = "seconds per million total tokens (lower is better)"
"""What a run's figures are, in its pytest-benchmark group's name (the table's heading)."""
HARDWARE_KEYS = ("gpu_name", "gpu_count", "cpu_model")
"""``machine_info`` keys that say which hardware measured a run; results differ across them."""


class HardwareMismatchWarning(pytest.PytestWarning):
    """A run is compared with one from other hardware: differences say nothing about vLLM.

    Make it fatal with ``-W error::pytest_qwenperf.plugin.benchmark.HardwareMismatchWarning``.
    """


def seconds_per_million_tokens(total_token_throughputs: Iterable[float | None]) -> list[float]:
    """``1e6 / total_token_throughput`` per repeat: lower is better, as pytest-benchmark assumes."""
    values = []
    for throughput in total_token_throughputs:
        if throughput is None or not math.isfinite(throughput) or throughput <= 0:
            raise ValueError(f"no throughput to record: total_token_throughput is {throughput!r}")
        values.append(1e6 / throughput)
    return values


def record(
    benchmark: Any,
    run: Run,
    seconds_per_unit: Sequence[float],
    *,
    group: str,
    name: str,
    params: Mapping[str, str],
    unit: str = UNIT,
) -> None:
    """Feed ``benchmark`` (pytest-benchmark's fixture) with measured values, one round each.

    ``run`` goes into ``extra_info["qwenperf"]`` as its JSON and its metrics into
    ``extra_info`` flat. With ``--benchmark-disable`` nothing is timed and no
    statistics are kept, as for any benchmark; ``--benchmark-skip`` skips the test before
    it gets here.
    """
    values = [float(s) for s in seconds_per_unit]
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{group} / {name}: seconds per unit must be positive and finite, got {list(seconds_per_unit)}")
    benchmark.group = group
    benchmark.name = name
    benchmark.params = dict(params)
    # Metadata keeps a reference to this dict, so it is filled in place, never replaced.
    benchmark.extra_info["qwenperf"] = json_safe(msgspec.to_builtins(run))
    benchmark.extra_info["unit"] = unit
    benchmark.extra_info.update(json_safe(flat_metrics(run)))
    benchmark._timer = _replay(values)  # the one private name used; the check below notices if it changes
    benchmark.pedantic(_no_work, rounds=len(values), iterations=1, warmup_rounds=0)
    if benchmark.enabled and benchmark.stats.stats.data != values:
        benchmark.has_error = True  # keeps the wrong figures out of the JSON and the storage
        raise RuntimeError(
            f"pytest-benchmark recorded {benchmark.stats.stats.data}, not the measured {values}: "
            "this pytest-benchmark version does not take replayed values"
        )


def record_run(benchmark: Any, run: Run) -> None:
    """Record one run: group ``suite/config`` and what the figures are, name the workload, one round per repeat
    (``samples.total_token_throughput``), so pytest-benchmark's statistics and
    ``--benchmark-compare-fail`` weigh the run-to-run spread; a run without samples (one
    measured before repeats were kept) is its single ``metrics`` value, one round."""
    identity = run.identity
    repeats = (run.samples or {}).get("total_token_throughput")
    throughputs = repeats or [run.metrics.get("total_token_throughput")]
    record(
        benchmark,
        run,
        seconds_per_million_tokens(None if t is None else float(t) for t in throughputs),
        group=f"{run.config_key}: {GROUP_UNIT}",
        name=identity.workload,
        params={"suite": identity.suite, "config": identity.config, "workload": identity.workload},
    )


def flat_metrics(run: Run) -> dict[str, Any]:
    """Whole-run metrics by name, steady-state ones as ``steady_state_<name>``, and the metrics
    the registry places in the ``server`` block (the server-side rates)."""
    flat: dict[str, Any] = dict(run.metrics)
    flat |= {f"steady_state_{key}": value for key, value in (run.steady_state or {}).items()}
    flat |= {info.name: getattr(run.server, info.path[1]) for info in METRICS.values() if info.path[0] == "server"}
    return flat


def _replay(values: Sequence[float]) -> Callable[[], float]:
    """A timer reading 0 at the start of each round and the round's value at its end."""
    readings = iter([reading for value in values for reading in (0.0, value)])

    def qwenperf_measured() -> float:  # pytest-benchmark records this name as the timer
        return next(readings)

    return qwenperf_measured


def _no_work() -> None:
    """What pytest-benchmark "runs" per round: the work was done by the load run."""


# ------------------------------------------------------------------ pytest-benchmark hooks


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(machine_info: dict[str, Any]) -> None:
    """The machine's record (GPU, driver, CUDA, CPU: ``core.machine.Machine``, spelled as every result
    spells it) and vLLM: what the figures depend on beyond what pytest-benchmark records."""
    distribution, version = installed_vllm() or (None, None)
    machine_info.update(msgspec.structs.asdict(detect().machine()), vllm_distribution=distribution, vllm_version=version)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_scale_unit(
    config: pytest.Config | None, unit: str, benchmarks: Sequence[Mapping[str, Any]], best: Any, worst: Any, sort: str
) -> tuple[str, float] | None:
    """Seconds as they are (``time in s``) in a table of load runs alone: its groups say "seconds per
    million total tokens", which pytest-benchmark's rescaling to ms or us would contradict. Other
    tables, operations per second, and an explicit ``--benchmark-time-unit`` are left to pytest-benchmark."""
    asked = config.getoption("benchmark_time_unit", None) if config is not None else None
    if unit != "seconds" or asked not in (None, "auto") or not benchmarks:
        return None
    if all(str(bench.get("group") or "").endswith(GROUP_UNIT) for bench in benchmarks):
        return "", 1.0
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_compare_machine_info(
    config: pytest.Config, machine_info: Mapping[str, Any], compared_benchmark: Mapping[str, Any]
) -> None:
    """Warn loudly on other hardware; pytest-benchmark's own hook still warns on any other difference."""
    saved = compared_benchmark.get("machine_info", {})
    if all(saved.get(key) == machine_info.get(key) for key in HARDWARE_KEYS):
        return
    when = compared_benchmark.get("datetime", "an unknown date")
    message = (
        f"COMPARING ACROSS DIFFERENT HARDWARE: the saved run of {when} was measured on {_hardware(saved)}, "
        f"this run on {_hardware(machine_info)}. Differences reflect the hardware, not vLLM or the serving "
        "config; compare runs from the same hardware (give each its own --benchmark-storage)."
    )
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("!", "qwenperf: hardware mismatch", red=True, bold=True)
        reporter.write_line(message, red=True, bold=True)
    config.issue_config_time_warning(HardwareMismatchWarning(message), stacklevel=2)


def _hardware(machine_info: Mapping[str, Any]) -> str:
    if not any(key in machine_info for key in HARDWARE_KEYS):
        return "unrecorded hardware"
    gpus = f"{machine_info.get('gpu_count')}x {machine_info.get('gpu_name')}" if machine_info.get("gpu_count") else "no GPU"
    return f"{gpus}, CPU {machine_info.get('cpu_model') or 'unknown'}"
