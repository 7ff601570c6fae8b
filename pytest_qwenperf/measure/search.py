"""A search workload's repeat: one capacity search (:func:`~pytest_qwenperf.measure.slo_capacity.find_capacity`)
whose probes are load runs of the workload at the loads the search picks.

The repeat's run is the run of its *chosen* probe (the highest load that met the SLO; the lowest
probed when none did), so every figure a run has describes the server at its capacity, with
``capacity_at_slo`` and ``capacity_output_throughput`` added and the whole search in
``Run.capacity``. Only the capacity is gated on such a run (``Run.gated_samples``). A search
that finds no load meeting the SLO has a capacity of 0 (and 0 tok/s at it): the worst outcome,
weighed with the other repeats, never a gap in their samples (``Run.capacity`` keeps that no
load was found). A point's repeats after its first start their searches at the bracket the repeat
before settled (``after``), which saves the bracketing and the bisection where the knee has not moved.

A probe fails the SLO whatever its latencies when its requests failed or the client fell behind
the load (for a rate, the requests it could not send in time): that is a server past its capacity.
What makes any probe's run invalid for another reason (the device's conditions, token counts that
disagree with the server) makes the repeat invalid: the whole search rested on that device.
A rate probe is stopped early when it is clearly over-saturated (:class:`Watch`): the client's
sends fell behind the schedule (by more than
:data:`~pytest_qwenperf.measure.slo_capacity.RATE_SHORTFALL`), or its queue and the TTFT of its requests by send
time both keep rising, the TTFT to twice what it was and past the SLO's TTFT limit
(:func:`~pytest_qwenperf.measure.slo_capacity.oversaturated`).
It sends no more requests, those in flight are cut (:meth:`~pytest_qwenperf.loadgen.requester.Requester.cut_in_flight`:
waiting for a queue that kept growing took as long again), and it fails the SLO. A concurrency probe caps
its requests in flight, so it cannot run away and is not watched; nor is a probe whose client runs
in several worker processes, which the watch cannot reach.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

import msgspec

from pytest_qwenperf.core.capacity import Slo
from pytest_qwenperf.core.combine import combined
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import CapacityProbe, CapacitySearch, Run
from pytest_qwenperf.loadgen.arrivals import OpenLoop
from pytest_qwenperf.measure.observe import Load, Watching
from pytest_qwenperf.measure.slo_capacity import (
    MIN_POINTS,
    Capacity,
    Probe,
    ProbeWindow,
    find_capacity,
    oversaturated,
    seed_of,
)
from pytest_qwenperf.suite.config import SuiteWorkload

CAPACITY = "capacity_at_slo"
CAPACITY_OUTPUT = "capacity_output_throughput"


class Watch:
    """Watches one probe's requests as they finish and says when to stop sending: when the probe
    is an open loop and :func:`~pytest_qwenperf.measure.slo_capacity.oversaturated` finds its sends
    behind the schedule, or both its queue (the requests its schedule has sent by then, less those
    finished) and the TTFT of its requests by send time rising. ``reason`` says why it stopped, once it has."""

    CHECK_EVERY = 8
    """Finished requests between two looks: each look refits both slopes over every request so far."""

    def __init__(self, ttft_limit_s: float | None = None) -> None:
        """``ttft_limit_s``: the SLO's TTFT limit, below which a rising TTFT stops no probe (see
        :func:`~pytest_qwenperf.measure.slo_capacity.oversaturated`)."""
        self.reason: str | None = None
        self._ttft_limit_s = ttft_limit_s
        self._offsets: tuple[float, ...] = ()
        self._warmup = 0
        self._finished: list[RequestRecord] = []
        self._looked = 0

    def start(self, load: Load) -> Watching | None:
        """Watch a run of ``load``: an open loop's measured requests (None for any other load, and
        for conversations, whose arrivals start whole chats rather than requests). A probe measured
        again (a retake, ``measure.run.Driver.run``) is watched afresh: nothing of the run before counts."""
        self.reason, self._finished, self._looked = None, [], 0
        if not isinstance(load.arrival, OpenLoop) or any(spec.turn is not None for spec in load.requests):
            return None
        self._offsets = tuple(load.arrival.offsets(len(load.requests) - load.options.warmup))
        self._warmup = load.options.warmup
        return Watching(progress=self._record, stop=self._stop)

    def _record(self, record: RequestRecord) -> None:
        if not record.warmup and record.first_token_at is not None:
            self._finished.append(record)

    def _stop(self) -> bool:
        if self.reason is None and len(self._finished) - self._looked >= self.CHECK_EVERY:
            self._looked = len(self._finished)
            self.reason = oversaturated(self._window(), self._ttft_limit_s)
        return self.reason is not None

    def _window(self) -> ProbeWindow:
        """The finished requests' send times and TTFTs, and the queue at each one's end, in seconds from the start."""
        done = sorted(self._finished, key=lambda r: r.ended_at)
        first = done[0]
        start = first.scheduled_at - self._offsets[first.index - self._warmup]
        queue = [(r.ended_at - start, bisect_right(self._offsets, r.ended_at - start) - k - 1) for k, r in enumerate(done)]
        by_send = sorted(done, key=lambda r: r.sent_at)
        ttft = [(r.sent_at - start, r.first_token_at - r.sent_at) for r in by_send if r.first_token_at is not None]
        asked, achieved = self._rates(by_send[-1], start)
        return ProbeWindow(sent=[t for t, _ in ttft], ttft=[v for _, v in ttft], in_flight=queue, requested_rate=asked, achieved_rate=achieved)

    def _rates(self, latest: RequestRecord, start: float) -> tuple[float | None, float | None]:
        """The rate the schedule asked for and the rate sent, up to the latest send among the finished
        requests: the client sends in order, so every request before it was sent by then. None
        until :data:`~pytest_qwenperf.measure.slo_capacity.MIN_POINTS` requests were due, so a few
        late sends at the start stop nothing."""
        elapsed = latest.sent_at - start
        due = bisect_right(self._offsets, elapsed)
        if due < MIN_POINTS or elapsed <= 0:
            return None, None
        return due / elapsed, (latest.index - self._warmup + 1) / elapsed


def search_once(
    measure: Callable[[SuiteWorkload, Watch], Run], workload: SuiteWorkload, after: CapacitySearch | None = None
) -> Run:
    """One search of ``workload`` (which has a ``search`` plan), each probe measured by ``measure``
    under a fresh :class:`Watch`; ``after``: the search of the point's repeat before, whose bracket
    this one probes first (:func:`~pytest_qwenperf.measure.slo_capacity.seed_of`)."""
    assert workload.search is not None, "a search workload has a plan"
    slo = workload.capacity_slo()
    seed = None if after is None else seed_of([Probe(p.load, p.latencies, p.output_throughput, p.stopped) for p in after.probes], slo)
    ttft_limit_ms = slo.targets.get("p99_ttft_ms")
    runs: list[tuple[float, Run]] = []

    def probe(load: float) -> Probe:
        watch = Watch(ttft_limit_ms / 1000 if ttft_limit_ms is not None else None)
        run = measure(workload.at_load(load), watch)
        runs.append((load, run))
        return _probe(load, run, slo, watch.reason)

    found = find_capacity(probe, slo, workload.search, seed)
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
        probes=tuple(_record(probe, run) for probe, (_, run) in zip(found.probes, runs, strict=True)),
    )
    # None found: not even the lowest load met the SLO, which weighs as no capacity at all.
    capacity, output = (0.0, 0.0) if found.load is None else (found.load, found.output_throughput)
    metrics = {**chosen.metrics, CAPACITY: capacity, CAPACITY_OUTPUT: output}
    # A probe's workload sends as many requests as its load needs: the search's is what was measured.
    identity = msgspec.structs.replace(chosen.identity, workload_fingerprint=workload.fingerprint())
    # The chosen probe's failures and client alone: a probe past the capacity failing is what the search looks for.
    return msgspec.structs.replace(whole, identity=identity, metrics=metrics, samples={}, client=chosen.client, capacity=(record,))


def _record(probe: Probe, run: Run) -> CapacityProbe:
    tpot = run.metrics.get("mean_tpot_ms")
    return CapacityProbe(
        load=probe.load,
        latencies=dict(probe.latencies),
        output_throughput=probe.output_throughput,
        mean_tpot_ms=float(tpot) if isinstance(tpot, (int, float)) else None,
        stopped=probe.stopped,
    )


def _probe(load: float, run: Run, slo: Slo, stopped: str | None) -> Probe:
    """A probe of ``run``: its SLO latencies and output tok/s, stopped where its watch stopped it,
    it failed requests or it fell behind."""
    reasons = [stopped] if stopped else []
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
