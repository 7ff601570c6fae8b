"""The load generator's HTTP client: streams requests to vLLM and records what it saw.

Requests are sent according to an :mod:`~pytest_qwenperf.loadgen.arrivals` plan, to the
endpoints by :attr:`LoadOptions.routing`, and each response becomes a
:class:`~pytest_qwenperf.core.records.RequestRecord`.

The client is the instrument, so it is lean: CPU it spends per request or per streamed
chunk delays the timing of every other stream. It speaks HTTP/1.1 itself, on sockets
read through the event loop, rather than through aiohttp. Measured on a 2-vCPU VM with uvloop, aiohttp's
client spends ~450 us of CPU per request and ~32 us per chunk (its body reader wakes a
task for every chunk), which at 256 streams put timing errors of 5-15 ms at p99; this
one spends ~144 us per request and ~13 us per chunk read on its own (2026-11-27), of which
~4 us is Python and the rest the kernel's (a bare loop that only waits and reads costs 8-10 us a
chunk here), and times each chunk by when the kernel received it
(:mod:`~pytest_qwenperf.loadgen.stamped_socket`), not when Python got to it. There is
no pool limit, no proxy and no line-length limit to configure.
The connections are :mod:`~pytest_qwenperf.loadgen.http`; :class:`~pytest_qwenperf.loadgen.sse.StreamParser`
reads token counts out of vLLM's chunks without decoding their JSON; :mod:`~pytest_qwenperf.loadgen.requester` sends one request. This module schedules:
the lanes of a closed loop, the arrivals of an open one (made ready ahead, a burst written at once), a conversation's turns,
warm-up and ramps, and the records.
"""

from __future__ import annotations

import asyncio
import gc
import os
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import WorkerClock
from pytest_qwenperf.core.window import KeptWindow
from pytest_qwenperf.loadgen.arrivals import (
    Arrival,
    ClosedLoop,
    OpenLoop,
    Steps,
    warmup_lanes,
)
from pytest_qwenperf.loadgen.assignment import Assignment, LoadOptions, Unit
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.requester import STOPPED, Progress, Requester, Stop, Written
from pytest_qwenperf.loadgen.window_keeper import WindowKeeper, keeper_of, lifetime_of


@dataclass(frozen=True, repr=False)
class LoadResult:
    """The records of one run and what the run was asked to do.

    ``started_at``/``ended_at`` bound the measured phase: from after the warm-up to the
    last measured request's end. ``client_cpus`` is the CPU affinity of each client
    process (one per worker). ``requested_rate``: the send rate the arrival asked for
    (:func:`~pytest_qwenperf.loadgen.arrivals.requested_rate`), None for a closed loop.
    """

    records: tuple[RequestRecord, ...]
    started_at: float
    ended_at: float
    arrival: Arrival
    options: LoadOptions
    client_cpus: tuple[tuple[int, ...], ...]
    requested_rate: float | None = None
    cpu_s: float | None = None  # CPU seconds of client workers that are neither this process nor its children (Ray actors)
    clocks: tuple[WorkerClock, ...] = ()  # client workers on a Ray cluster's nodes, with their clocks against this one
    window: KeptWindow | None = None  # the window a time-bounded load measured (``options.window``)

    def __repr__(self) -> str:
        """Short: asyncio.Runner formats its task's result on exit (Python 3.11), and a full
        repr of every record of a long run costs seconds."""
        return f"LoadResult({len(self.records)} records, {self.ended_at - self.started_at:.3f} s, {self.arrival!r})"


SPIN_S = 0.0015
"""uvloop's timers fire to the whole millisecond, up to one late: after a long wait (ten times this
or more: a trace's next burst, a sparse open loop) :func:`_until` sleeps to this much before the
time, then yields to the loop, which reads the sockets meanwhile, until it. At most a tenth of a
wait is spent so; shorter waits (a dense schedule) only sleep, and a send may be a millisecond late."""


async def _until(at: float) -> None:
    if at - perf_counter() >= 10 * SPIN_S:
        await asyncio.sleep(at - perf_counter() - SPIN_S)
        while perf_counter() < at:
            await asyncio.sleep(0)
    while (delay := at - perf_counter()) > 0:
        await asyncio.sleep(delay)


@dataclass(frozen=True)
class _Sender:
    """Sends one request of a phase: under an open loop's cap (``limit``), one held back by it past
    ``deadline`` is not sent; none is sent once ``window`` is done. ``traced``: in a replay, the
    clock time a request traced at a time is due (a later turn of a traced conversation waits for it)."""

    client: Requester
    limit: asyncio.Semaphore | None
    deadline: float | None
    warmup: bool
    window: WindowKeeper | None = None
    traced: Callable[[float], float] | None = None

    def now(self, position: int, spec: RequestSpec) -> Written | None:
        """The request written at once where nothing holds it back (no cap to wait under, a
        connection idle); None: send it by :meth:`__call__` alone."""
        if self.limit is not None or (self.window is not None and self.window.done()):
            return None
        return self.client.write_now(position, spec, self.window)

    async def __call__(self, position: int, spec: RequestSpec, at: float | None, written: Written | None = None) -> RequestRecord | None:
        """The request's record (``at``: when it was due; None: now); None if it was not sent."""
        if written is not None:
            return await self.client.send(position, spec, at, self.warmup, self.window, written)
        if self.limit is None:
            return await self._windowed(position, spec, at)
        async with self.limit:
            if self.deadline is not None and perf_counter() >= self.deadline:
                return None
            return await self._windowed(position, spec, at)

    async def _windowed(self, position: int, spec: RequestSpec, at: float | None) -> RequestRecord | None:
        if self.window is not None and self.window.done():
            return None
        return await self.client.send(position, spec, at, self.warmup, self.window)


async def _unit(send: _Sender, unit: Unit, at: float | None, deadline: float | None, written: Written | None = None) -> list[RequestRecord]:
    """Send ``unit``'s requests one after another, the first due ``at`` (None: now, in a closed loop;
    ``written``: written already, :meth:`_Sender.now`).

    A later turn is due its think time after the previous turn's end, in a replay not before its
    traced time; that is its record's ``scheduled_at`` (a turn sent late shows as lag). It is not
    sent when that is past ``deadline`` or when the previous turn failed, which ends the
    conversation. While a user thinks nothing is in flight: no place under the open loop's cap is
    held and no endpoint counts it.
    """
    records: list[RequestRecord] = []
    position = unit[0][0]
    for _, spec in unit:
        if records:
            previous = records[-1]
            if not previous.ok:
                break
            at = previous.ended_at + (spec.turn.think_s if spec.turn is not None else 0.0)
            if send.traced is not None and spec.at is not None:
                at = max(at, send.traced(spec.at))
            if deadline is not None and at >= deadline:
                break
            await _until(at)
        record = await send(position, spec, at, written)
        if record is None:
            break
        records.append(record)
        written = None
    return records


async def _closed(
    send: _Sender, units: Sequence[Unit], steps: Steps, deadline: float | None, done: Stop | None = None
) -> list[RequestRecord]:
    """Lanes that each send one unit after another, until ``deadline`` or until ``done`` says so; a
    step of ``steps`` adds lanes once the units taken reach its start."""
    records: list[RequestRecord] = []
    queue = iter(units)
    lanes: list[asyncio.Task[None]] = []
    taken = 0

    def add_lanes() -> None:
        wanted = min(max(count for start, count in steps if start <= taken), len(units))
        lanes.extend(asyncio.create_task(lane()) for _ in range(wanted - len(lanes)))

    async def lane() -> None:
        nonlocal taken
        for unit in queue:
            if (deadline is not None and perf_counter() >= deadline) or (done is not None and done()):
                return
            taken += 1
            add_lanes()
            records.extend(await _unit(send, unit, None, deadline))

    add_lanes()
    awaited = 0
    while awaited < len(lanes):  # lanes added meanwhile are awaited too
        await lanes[awaited]
        awaited += 1
    return records


AHEAD_S = 0.1
"""How long before its time a scheduled request is made ready (:meth:`Requester.ahead`): the JSON
of a long prompt takes a fraction of a millisecond, a connect about as much on a local network,
and a trace's burst sends dozens in one millisecond."""


def _soon(units: Sequence[Unit], offsets: Sequence[float]) -> Sequence[Unit]:
    """The first of ``units`` and those due within :data:`AHEAD_S` of it."""
    return units[: bisect_right(offsets, offsets[0] + AHEAD_S)] if units else units


async def _open(
    send: _Sender, units: Sequence[Unit], offsets: Sequence[float], start: float, deadline: float | None, stop: Stop | None = None
) -> list[asyncio.Task[list[RequestRecord]]]:
    """Start each unit at ``start`` plus its offset, until ``deadline`` or until ``stop`` says so;
    returns once the last has started, with the tasks that send them.

    Each unit is made ready :data:`AHEAD_S` before its time; at its time it and every unit due by
    then are written at once (:meth:`_Sender.now`), and only then are their responses awaited: a
    burst due in one millisecond goes out in one go, not one request per turn of the loop."""
    tasks: list[asyncio.Task[list[RequestRecord]]] = []
    ready = index = 0  # units made ready; units started
    stopped = False
    while index < len(units) and not stopped:
        if deadline is not None and start + offsets[index] >= deadline:
            break
        if ready <= index:
            await _until(start + offsets[index] - AHEAD_S)
            first, ready = ready, bisect_right(offsets, offsets[index] + AHEAD_S)
            send.client.ahead(units[first:ready])
        await _until(start + offsets[index])
        due: list[tuple[Unit, float, Written | None]] = []
        now = perf_counter()
        while index < len(units) and (at := start + offsets[index]) <= now:
            if (deadline is not None and at >= deadline) or (stop is not None and stop()):
                stopped = True
                break
            unit = units[index]
            due.append((unit, at, send.now(*unit[0])))
            index += 1
        tasks.extend(asyncio.create_task(_unit(send, unit, at, deadline, written)) for unit, at, written in due)
    return tasks


async def _gathered(tasks: Sequence[asyncio.Task[list[RequestRecord]]]) -> list[RequestRecord]:
    return [record for records in await asyncio.gather(*tasks) for record in records]


def _limit(arrival: Arrival) -> asyncio.Semaphore | None:
    cap = arrival.max_concurrency if isinstance(arrival, OpenLoop) else None
    return asyncio.Semaphore(cap) if cap else None


async def _measured(
    client: Requester, assignment: Assignment, start: float, limit: asyncio.Semaphore | None, lifetime_s: float | None = None
) -> tuple[list[RequestRecord], KeptWindow | None]:
    arrival, duration_s = assignment.arrival, assignment.options.duration_s
    deadline = None if duration_s is None else start + duration_s
    window = keeper_of(assignment, start, lifetime_s, client.cut_in_flight)
    send = _Sender(client, limit, deadline, False, window, assignment.traced(start))
    done = window.done if window is not None else None
    if isinstance(arrival, ClosedLoop):
        records = await _closed(send, assignment.units, ((0, arrival.concurrency),), deadline, done)
    else:
        assert assignment.offsets is not None
        stopped = False  # by the client's stop, whose run then cuts its requests in flight (a window cuts them when done)

        def stop() -> bool:
            nonlocal stopped
            stopped = stopped or (client.stop is not None and client.stop())
            return stopped or (done is not None and done())

        tasks = await _open(send, assignment.units, assignment.offsets, start, deadline, stop)
        if stopped:
            client.cut_in_flight(STOPPED)
        records = await _gathered(tasks)
    return records, window.kept() if window is not None else None


async def _phased(
    client: Requester, assignment: Assignment, sync: Callable[[], Awaitable[None]] | None
) -> tuple[list[RequestRecord], float, KeptWindow | None]:
    """The warm-up as a closed loop, all of it finished before the measured phase starts."""
    warmup = assignment.warmup
    records = await _closed(_Sender(client, None, None, True), warmup, warmup_lanes(assignment.arrival, len(warmup)), None)
    if assignment.offsets is not None:  # the first requests due made ready before the clock starts
        await client.ready(_soon(assignment.units, assignment.offsets))
    if sync is not None:
        await sync()
    started_at = perf_counter()
    measured, window = await _measured(client, assignment, started_at, _limit(assignment.arrival), lifetime_of(records))
    return records + measured, started_at, window


async def _ramped(client: Requester, assignment: Assignment) -> tuple[list[RequestRecord], float, KeptWindow | None]:
    """An open loop's warm-up at its rising rate, then at once the measured phase at the full rate
    while the warm-up's last requests still run; one cap on requests in flight for both."""
    assert assignment.ramp is not None
    limit = _limit(assignment.arrival)
    await client.ready(_soon(assignment.warmup, assignment.ramp))
    start = perf_counter()
    warmup = await _open(_Sender(client, limit, None, True), assignment.warmup, assignment.ramp, start, None)
    started_at = start + assignment.ramp_s
    records, window = await _measured(client, assignment, started_at, limit)
    return await _gathered(warmup) + records, started_at, window


async def run_jobs(
    assignment: Assignment,
    *,
    progress: Progress | None,
    sync: Callable[[], Awaitable[None]] | None = None,
    stop: Stop | None = None,
) -> tuple[list[RequestRecord], float, float, KeptWindow | None]:
    """The engine behind :func:`run_load` and each worker: ``(records, started_at, ended_at, window)``.

    ``sync`` (workers) is awaited before the warm-up and again before the measured phase so
    that all workers start together; a ramp runs on into the measured phase, so then only before it.
    ``stop``: see :data:`Stop`.
    """
    if not assignment.endpoints:
        raise ValueError("no endpoints")
    client = Requester(assignment.endpoints, assignment.model, assignment.options, progress, stop)
    gc.collect()
    gc.freeze()  # a full collection over everything imported stalls the loop for >10 ms; only scan what the run creates
    try:
        if sync is not None:
            await sync()
        if assignment.ramp is None:
            records, started_at, window = await _phased(client, assignment, sync)
        else:
            records, started_at, window = await _ramped(client, assignment)
        ended_at = perf_counter()
    finally:
        client.close()
        gc.unfreeze()
    records.sort(key=lambda record: record.sent_at)
    return records, started_at, ended_at, window


async def run_load(
    endpoints: Sequence[str],
    model: str,
    requests: Iterable[RequestSpec],
    arrival: Arrival,
    options: LoadOptions = LoadOptions(),
    *,
    progress: Progress | None = None,
    stop: Stop | None = None,
) -> LoadResult:
    """Send ``requests`` to ``endpoints`` (base URLs, chosen per request by ``options.routing``).

    The first ``options.warmup`` requests go first as a closed loop and are marked
    ``warmup``; the measured phase starts when they have all finished and sends the rest
    by ``arrival``, until the workload or ``options.duration_s`` is exhausted (requests in
    flight then finish and count). An open loop with a ``ramp`` sends the warm-up at its rising
    rate instead and starts the measured phase at the ramp's end. A conversation's turns go one
    after another (:class:`~pytest_qwenperf.loadgen.request.Turn`). ``progress`` is called with
    each finished record; ``stop`` can end an open loop's sending early (:data:`Stop`).
    """
    assignment = Assignment.of(endpoints, model, requests, arrival, options)
    records, started_at, ended_at, window = await run_jobs(assignment, progress=progress, stop=stop)
    cpus = (tuple(sorted(os.sched_getaffinity(0))),)
    return LoadResult(tuple(records), started_at, ended_at, arrival, options, cpus, assignment.requested_rate, window=window)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (vLLM depends on it), else asyncio's own loop.

    uvloop costs the client about a quarter less CPU per streamed chunk, which is what
    decides how many streams one client process times accurately.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_load_sync(
    endpoints: Sequence[str],
    model: str,
    requests: Iterable[RequestSpec],
    arrival: Arrival,
    options: LoadOptions = LoadOptions(),
    *,
    progress: Progress | None = None,
    stop: Stop | None = None,
) -> LoadResult:
    """:func:`run_load` on a fresh event loop (see :func:`new_event_loop`), for callers without one."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(run_load(endpoints, model, requests, arrival, options, progress=progress, stop=stop))
