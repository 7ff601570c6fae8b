"""Load from client workers spread over the nodes of a Ray cluster, for loads one machine cannot send.

The same split as :mod:`~pytest_qwenperf.loadgen.workers` (request ``i`` to worker ``i % n``, a
conversation whole, the closed loop's concurrency shared, the open loop's one schedule kept), but
each worker is a Ray actor holding one CPU, placed with Ray's ``SPREAD`` strategy, running the
same client on its own event loop (:func:`~pytest_qwenperf.loadgen.client.run_jobs`). Workers meet
at a barrier actor before the warm-up and again before the measured phase. Ray is what vLLM itself
uses to serve on several nodes, so a user with a multi-node deployment already runs it; nothing
here is a scheduler or an RPC of our own.

**One time base.** ``perf_counter`` is per host. Before the run and after it, the driver asks each
worker for its clock :data:`PINGS` times and keeps the answer with the shortest round trip (NTP's
clock filter): the worker's clock read at the middle of that round trip, so the offset is known to
within half of it. The two readings give a line: every time a worker records is moved onto the
driver's ``perf_counter`` by the offset interpolated at that time between the reading before the
run and the one after it (:class:`ClockLine`), so a clock that runs fast or slow is corrected over
the run, not only at its start. The offset before and the drift (after minus before) are kept per
worker (:class:`~pytest_qwenperf.core.run.WorkerClock`), and an offset or drift above 1 ms is reported.

**Exact merge.** Workers return their raw per-request records; the driver sorts them by send time
on its own clock. Percentiles then come from every request, and token totals are the records'
sums, which the run cross-checks against the servers' ``/metrics`` deltas as for one process.

**Lost workers.** A worker whose actor dies (its process killed, its node lost) fails the run with
an error naming it: its index, node, address and pid. Every actor is killed when the run ends, however
it ends; an actor is owned by the driver, so Ray also kills them if the driver process dies.

``ray`` is imported only when a run asks for it (the ``ray`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import WorkerClock
from pytest_qwenperf.core.window import KeptWindow, common
from pytest_qwenperf.loadgen.assignment import Assignment
from pytest_qwenperf.loadgen.client import LoadResult, new_event_loop, run_jobs
from pytest_qwenperf.loadgen.requester import Progress
from pytest_qwenperf.loadgen.workers import BARRIER_TIMEOUT_S, check_split, share_of

PINGS = 16
"""Clock readings per worker at each end of the run; the one with the shortest round trip is kept."""
POLL_S = 0.5
"""How often the driver looks for finished or lost workers."""


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached."""


class WorkerLost(RuntimeError):
    """A worker's actor died during the run; the message names it."""


class ClientWorker:
    """One client worker, a Ray actor: it runs a share of the load on an event loop of its own."""

    def where(self) -> tuple[str, str, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def clock(self) -> float:
        return time.perf_counter()

    def run(
        self, assignment: Assignment, barrier: Any
    ) -> tuple[list[RequestRecord], float, float, float, tuple[int, ...], KeptWindow | None]:
        """The share's records, its measured phase's start and end (its own clock), the CPU seconds
        it used, its CPUs and the window it kept (its own clock)."""
        import ray

        async def sync() -> None:
            await asyncio.to_thread(ray.get, barrier.wait.remote(), timeout=BARRIER_TIMEOUT_S)

        cpu = time.process_time()
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            records, started_at, ended_at, window = runner.run(run_jobs(assignment, progress=None, sync=sync))
        return records, started_at, ended_at, time.process_time() - cpu, tuple(sorted(os.sched_getaffinity(0))), window


class _Barrier:
    """``n`` workers wait until all have arrived, as often as they meet (an async actor: one event loop)."""

    def __init__(self, n: int) -> None:
        self.n, self.arrived, self.generation = n, 0, 0
        self.events: dict[int, asyncio.Event] = {}

    async def wait(self) -> None:
        generation = self.generation
        event = self.events.setdefault(generation, asyncio.Event())
        self.arrived += 1
        if self.arrived == self.n:
            self.arrived, self.generation = 0, generation + 1
            event.set()
        else:
            await event.wait()


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``host:port`` or ``ray://host:port``) once per process."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("client workers on Ray need the ray package: pip install 'pytest-qwenperf[ray]'") from None
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailable(f"cannot join the Ray cluster at {address}: {exc}") from None


def run_load_on_ray(address: str, n_workers: int, whole: Assignment, *, progress: Progress | None = None) -> LoadResult:
    """``whole`` (:class:`~pytest_qwenperf.loadgen.assignment.Assignment`) split over ``n_workers`` Ray
    actors of the cluster at ``address``, on the driver's clock; each worker's clock in ``clocks``.
    ``progress`` is told of every record once the workers are done (they return them at the end)."""
    check_split(whole.arrival, n_workers)
    connect(address)
    import ray

    worker_class: Any = ray.remote(num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")(ClientWorker)
    barrier: Any = ray.remote(num_cpus=0)(_Barrier).remote(n_workers)
    actors: list[Any] = [worker_class.remote() for _ in range(n_workers)]
    try:
        places = _get([actor.where.remote() for actor in actors], {})
        names = {k: f"client worker {k} (node {node[:12]}, {ip}, pid {pid})" for k, (node, ip, pid) in enumerate(places)}
        before = [_reading(actor, names[k]) for k, actor in enumerate(actors)]
        shares = [share_of(whole, n_workers, k) for k in range(n_workers)]
        outcomes = _get([actor.run.remote(share, barrier) for actor, share in zip(actors, shares, strict=True)], names)
        after = [_reading(actor, names[k]) for k, actor in enumerate(actors)]
    finally:
        for actor in [*actors, barrier]:
            with contextlib.suppress(Exception):  # an actor already dead has nothing left to stop
                ray.kill(actor, no_restart=True)
    lines = [ClockLine(start, end) for start, end in zip(before, after, strict=True)]
    records: list[RequestRecord] = []
    spans = []
    windows: list[KeptWindow | None] = []
    for (found, started_at, ended_at, _, _, window), line in zip(outcomes, lines, strict=True):
        records += [line.shifted(record) for record in found]
        spans.append((line(started_at), line(ended_at)))
        windows.append(None if window is None else dataclasses.replace(window, opened=line(window.opened), closed=line(window.closed)))
    records.sort(key=lambda record: record.sent_at)
    if progress is not None:
        for record in records:
            progress(record)
    clocks = tuple(
        WorkerClock(
            worker=k, node=node, address=ip, pid=pid, offset_s=line.before.offset, drift_s=line.drift, round_trip_s=line.before.round_trip
        )
        for k, ((node, ip, pid), line) in enumerate(zip(places, lines, strict=True))
    )
    return LoadResult(
        records=tuple(records),
        started_at=min(span[0] for span in spans),
        ended_at=max(span[1] for span in spans),
        arrival=whole.arrival,
        options=whole.options,
        client_cpus=tuple(outcome[4] for outcome in outcomes),
        requested_rate=whole.requested_rate,
        cpu_s=sum(outcome[3] for outcome in outcomes),
        clocks=clocks,
        window=common(windows),
    )


def _get(refs: Sequence[Any], names: dict[int, str]) -> list[Any]:
    """Every ref's value, in order (ref ``k`` a call to worker ``k``, named in ``names``); the first
    worker found dead fails it, named."""
    import ray

    pending = {ref: k for k, ref in enumerate(refs)}
    values: dict[int, Any] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
        for ref in ready:
            k = pending.pop(ref)
            try:
                values[k] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                name = names.get(k, f"client worker {k}")
                raise WorkerLost(f"{name} was lost during the run: {_first_line(exc)}") from None
    return [values[k] for k in range(len(refs))]


@dataclass(frozen=True)
class ClockReading:
    """A worker's clock against the driver's: ``offset`` is what to add to the worker's clock to
    read the driver's at ``at`` (the worker's clock), known to within half of ``round_trip``."""

    offset: float
    round_trip: float
    at: float


@dataclass(frozen=True)
class ClockLine:
    """A worker's times on the driver's clock: the offset interpolated, at each time, between the
    reading before the run and the one after it (held at the nearer reading outside them)."""

    before: ClockReading
    after: ClockReading

    @property
    def drift(self) -> float:
        """How far the offset moved over the run."""
        return self.after.offset - self.before.offset

    def __call__(self, t: float) -> float:
        span = self.after.at - self.before.at
        share = min(max((t - self.before.at) / span, 0.0), 1.0) if span > 0 else 0.0
        return t + self.before.offset + share * self.drift

    def shifted(self, record: RequestRecord) -> RequestRecord:
        """``record`` with every time it holds moved onto the driver's clock."""
        return dataclasses.replace(
            record,
            scheduled_at=self(record.scheduled_at),
            sent_at=self(record.sent_at),
            ended_at=self(record.ended_at),
            chunk_times=tuple(self(t) for t in record.chunk_times),
        )


def _reading(actor: Any, name: str) -> ClockReading:
    """``actor``'s clock against the driver's: the shortest of :data:`PINGS` round trips, its
    reading taken to be at the round trip's middle."""
    best: ClockReading | None = None
    for _ in range(PINGS):
        sent = time.perf_counter()
        (theirs,) = _get([actor.clock.remote()], {0: name})
        back = time.perf_counter()
        if best is None or back - sent < best.round_trip:
            best = ClockReading(offset=(sent + back) / 2 - theirs, round_trip=back - sent, at=theirs)
    assert best is not None
    return best


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
