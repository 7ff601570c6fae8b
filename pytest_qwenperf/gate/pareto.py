"""The Pareto view of a comparison: what each measured point gives one user against what it gets
out of the hardware, per rung (a config of a suite), one colour per compared column.

A point is one repeat of one run of one file (the run's value where it keeps no repeats), or one
probe of a capacity search:

* x, output tok/s per user: ``1000 / mean_tpot_ms``, how fast one stream's tokens arrive;
* y, output tok/s per device: the run's ``output_throughput`` over its device count. On GPUs
  that is TP × PP × DP × replicas, the flags of the run's vLLM argv (``identity.argv``,
  ``--tensor-parallel-size``/``-tp``, ``--pipeline-parallel-size``/``-pp``,
  ``--data-parallel-size``/``-dp``, each 1 where absent) times ``context.replicas``: the same
  argv the server pool reserves the GPUs of each replica from. On the CPU build (the engine's
  ``device_config.device`` where the run recorded the engine config, else its hardware kind) a
  device is a core the servers ran on: ``telemetry.cpu.server_cores.cores``, the affinity of
  every replica's processes.

A run whose device count or values cannot be read is a :class:`CompareError` naming the file,
the run and the field, never a guessed count of 1: a per-device figure off by the TP size would
put a rung on the wrong side of another. Bench results are refused for the same reason: they
record no argv, replicas or server cores.

Each column's points on a rung are joined by their :func:`frontier`. Pure data; the chart is
:func:`~pytest_qwenperf.gate.compare_output.plot_pareto`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pytest_qwenperf.core import parallel
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import MISSING
from pytest_qwenperf.gate.compare import CompareError, RunSet
from pytest_qwenperf.gate.setups import Result

Rung = tuple[str, str]
"""A rung of the ladder: (suite, config), a compared group's key without its workload."""

_TPOT, _OUTPUT = "mean_tpot_ms", "output_throughput"


@dataclass(frozen=True)
class ParetoPoint:
    label: str  # the compared column: its vLLM version, else its file name
    rung: Rung
    workload: str
    per_user: float  # output tok/s per user: 1000 / mean TPOT (ms)
    per_device: float  # output tok/s per GPU, or per server core on the CPU build
    device: str  # "GPU" or "core"
    source: str  # the file, and the repeat where the run kept them: "new.json, repeat 2 of 3"


@dataclass(frozen=True)
class Devices:
    """What a run's throughput is divided by."""

    count: int
    kind: str  # "GPU" or "core"


def points_of(sets: Sequence[RunSet], labels: Sequence[str]) -> tuple[ParetoPoint, ...]:
    """Every measured point of every file of every column; ``labels`` one per column
    (:attr:`~pytest_qwenperf.gate.compare.Comparison.labels`)."""
    return tuple(
        point for run_set, label in zip(sets, labels, strict=True) for result in run_set.results for point in _measured(result, label)
    )


def _measured(result: Result, label: str) -> Iterator[ParetoPoint]:
    """One point per repeat of ``result``'s run; a search workload's, one per probe of each search
    (its repeats' own figures are their chosen probes', already among them)."""
    if result.setup is not None:
        raise CompareError(
            f"{result.file}: a bench result ({result.setup.client}) records no vLLM argv, replicas or server cores, "
            "so no output tok/s per device: --pareto needs suite runs (session or pytest-benchmark JSON)"
        )
    run = result.run
    where = f"{result.file}: run of {run.config_key} on {run.identity.workload}"
    devices = devices_of(run, where)
    suite, config, workload = result.key
    for repeat, tpot, output in _probes(run) if run.capacity else _figures(run, where):
        source = f"{result.file.name}, {repeat}" if repeat else result.file.name
        yield ParetoPoint(label, (suite, config), workload, 1000.0 / tpot, output / devices.count, devices.kind, source)


def _figures(run: Run, where: str) -> list[tuple[str, float, float]]:
    """(repeat, mean TPOT, output tok/s) of each repeat where the run keeps both per repeat, else
    ("", its values)."""
    samples = run.samples or {}
    tpots, outputs = samples.get(_TPOT), samples.get(_OUTPUT)
    if tpots and outputs and len(tpots) == len(outputs):
        n = len(tpots)
        return [
            (f"repeat {i + 1} of {n}", _positive(tpot, f"samples.{_TPOT}[{i}]", where), _positive(out, f"samples.{_OUTPUT}[{i}]", where))
            for i, (tpot, out) in enumerate(zip(tpots, outputs, strict=True))
        ]
    tpot, output = (run.metrics.get(name, MISSING) for name in (_TPOT, _OUTPUT))
    return [("", _positive(tpot, f"metrics.{_TPOT}", where), _positive(output, f"metrics.{_OUTPUT}", where))]


def _probes(run: Run) -> list[tuple[str, float, float]]:
    """(which probe, mean TPOT, output tok/s) of every probe of the run's searches that delivered
    tokens; a probe that failed or fell behind is past the capacity, not a point of the frontier."""
    n = len(run.capacity)
    return [
        (f"search {k + 1} of {n}, probe at {probe.load:g}", probe.mean_tpot_ms, probe.output_throughput)
        for k, search in enumerate(run.capacity)
        for probe in search.probes
        if probe.stopped is None and probe.mean_tpot_ms and probe.output_throughput > 0
    ]


def _positive(value: object, field: str, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    got = value if value is MISSING else show(value)
    raise CompareError(f"{where}: {field}: expected a positive number (the Pareto view plots it), got {got}")


def devices_of(run: Run, where: str) -> Devices:
    """The GPUs of the run's servers, or their cores on the CPU build (see the module's docstring);
    :class:`CompareError` naming ``where`` and the missing field when the run does not say."""
    if _on_cpu(run, where):
        return Devices(_server_cores(run, where), "core")
    replicas = run.context.replicas
    if replicas is None or replicas < 1:
        raise CompareError(
            f"{where}: context.replicas: expected the number of servers (the GPU count is TP × PP × DP × replicas), "
            f"got {MISSING if replicas is None else show(replicas)}"
        )
    return Devices(gpus_per_server(run.identity.argv, where) * replicas, "GPU")


def _on_cpu(run: Run, where: str) -> bool:
    """The engine's device where the run recorded the engine config (a GPU host without NVML
    reports its machine as ``cpu``), else the machine's kind."""
    environment, machine = run.context.environment, run.context.machine
    device = environment.engine.get("device_config.device") if environment else None
    if device is not None:
        return device == '"cpu"'  # engine values are JSON text
    if machine is None or machine.kind is None:
        raise CompareError(
            f"{where}: context.machine.kind: expected 'cpu' or a GPU kind (no engine config tells the device either), got {MISSING}"
        )
    return machine.kind == "cpu"


def gpus_per_server(argv: Sequence[str], where: str) -> int:
    """TP × PP × DP from a vLLM argv (:func:`~pytest_qwenperf.core.parallel.gpus_per_server`), a bad
    value a :class:`CompareError` naming ``where``."""
    try:
        return parallel.gpus_per_server(argv)
    except ValueError as exc:
        raise CompareError(f"{where}: identity.argv: {exc}") from None


def _server_cores(run: Run, where: str) -> int:
    """How many cores the servers' processes could run on, all replicas together."""
    cores = _get(run.telemetry, "cpu", "server_cores", "cores")
    if isinstance(cores, list) and cores:
        return len(cores)
    got = MISSING if cores is None else show(cores)
    raise CompareError(
        f"{where}: telemetry.cpu.server_cores.cores: expected the server's cores (on the CPU build a device is a core), got {got}"
    )


def _get(node: object, *path: str) -> object:
    """The value at ``path`` through JSON objects; None where a step is missing."""
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def frontier(points: Sequence[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """The points no other point beats on one axis without losing on the other, by per-user
    tok/s (so per-device tok/s falls along them); points equal on both axes all stay."""
    kept = [p for p in points if not any(_dominates(q, p) for q in points)]
    return tuple(sorted(kept, key=lambda p: (p.per_user, -p.per_device)))


def _dominates(a: ParetoPoint, b: ParetoPoint) -> bool:
    at_least = a.per_user >= b.per_user and a.per_device >= b.per_device
    return at_least and (a.per_user, a.per_device) != (b.per_user, b.per_device)


def by_rung(points: Sequence[ParetoPoint]) -> dict[Rung, dict[str, tuple[ParetoPoint, ...]]]:
    """Rung → column label → its points, in the order they come (rungs and columns as first met)."""
    found: dict[Rung, dict[str, list[ParetoPoint]]] = {}
    for point in points:
        found.setdefault(point.rung, {}).setdefault(point.label, []).append(point)
    return {rung: {label: tuple(mine) for label, mine in columns.items()} for rung, columns in found.items()}
