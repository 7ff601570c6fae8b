"""A search workload's repeat: one capacity search (:func:`~pytest_qwenperf.measure.slo_capacity.find_capacity`)
whose probes are load runs of the workload at the loads the search picks.

The repeat's run is the run of its *chosen* probe (the highest load that met the SLO; the lowest
probed when none did), so every figure a run has describes the server at its capacity, with
``capacity_at_slo`` and ``capacity_output_throughput`` added and the whole search in
``Run.capacity``. Only the capacity is gated on such a run (``Run.gated_samples``).

A probe fails the SLO whatever its latencies when its requests failed or the client fell behind
the load (for a rate, the requests it could not send in time): that is a server past its capacity.
What makes any probe's run invalid for another reason (the device's conditions, token counts that
disagree with the server) makes the repeat invalid: the whole search rested on that device.
A probe runs its requests to the end; it is not stopped early.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from pytest_qwenperf.core.capacity import Slo
from pytest_qwenperf.core.run import CapacityProbe, CapacitySearch, Run, combined
from pytest_qwenperf.measure.slo_capacity import Capacity, Probe, find_capacity
from pytest_qwenperf.suite.config import SuiteWorkload

CAPACITY = "capacity_at_slo"
CAPACITY_OUTPUT = "capacity_output_throughput"


def search_once(measure: Callable[[SuiteWorkload], Run], workload: SuiteWorkload) -> Run:
    """One search of ``workload`` (which has a ``search`` plan), each probe measured by ``measure``."""
    assert workload.search is not None, "a search workload has a plan"
    slo = workload.capacity_slo()
    runs: list[tuple[float, Run]] = []

    def probe(load: float) -> Probe:
        run = measure(workload.at_load(load))
        runs.append((load, run))
        return _probe(load, run, slo)

    found = find_capacity(probe, slo, workload.search)
    chosen = _chosen(found, runs, slo)
    whole = combined([run for _, run in runs], chosen, {}, "probes")
    record = CapacitySearch(
        search=found.search,
        slo=dict(slo.targets),
        load=found.load,
        interval=found.interval,
        output_throughput=found.output_throughput,
        binding=found.binding,
        cliff=found.cliff,
        bound=found.bound,
        probes=tuple(CapacityProbe(load=p.load, latencies=dict(p.latencies), output_throughput=p.output_throughput, stopped=p.stopped) for p in found.probes),
    )
    metrics = {**chosen.metrics, CAPACITY: found.load, CAPACITY_OUTPUT: found.output_throughput}
    # The chosen probe's failures and client alone: a probe past the capacity failing is what the search looks for.
    return msgspec.structs.replace(whole, metrics=metrics, samples={}, client=chosen.client, capacity=(record,))


def _probe(load: float, run: Run, slo: Slo) -> Probe:
    """A probe of ``run``: its SLO latencies and output tok/s, stopped where it failed requests or fell behind."""
    reasons = []
    if run.failed_requests:
        reasons.append(f"{run.failed_requests} request(s) failed")
    if run.client_bound:
        reasons.append(f"the load was not sent in time ({run.client_bound})")
    latencies = {name: float(value) for name in slo.targets if isinstance(value := run.metrics.get(name), (int, float))}
    output = run.metrics.get("output_throughput")
    return Probe(load, latencies, float(output) if isinstance(output, (int, float)) else 0.0, "; ".join(reasons) or None)


def _chosen(found: Capacity, runs: list[tuple[float, Run]], slo: Slo) -> Run:
    """The run of the highest probed load that met the SLO, else of the lowest load probed."""
    met = [(load, run) for (load, run), probe in zip(runs, found.probes, strict=True) if probe.meets(slo)]
    if met:
        return max(met, key=lambda pair: pair[0])[1]
    return min(runs, key=lambda pair: pair[0])[1]
