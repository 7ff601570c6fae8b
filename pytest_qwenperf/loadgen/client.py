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
reads token counts out of vLLM's chunks without decoding their JSON. This module schedules:
the lanes of a closed loop, the arrivals of an open one, a conversation's turns, routing,
warm-up and ramps, and the records.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
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
from pytest_qwenperf.loadgen.http import Connection, Endpoint
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.sse import StreamParser, http_error
from pytest_qwenperf.loadgen.window_keeper import WindowKeeper, keeper_of, lifetime_of

Progress = Callable[[RequestRecord], None]
Stop = Callable[[], bool]
"""Asked before each measured send of an open loop or a replay: True ends the sending (requests in
flight finish and count), as a capacity search stops a probe that is clearly over-saturated."""
Send = Callable[[int, RequestSpec, float | None], Awaitable[RequestRecord | None]]  # (routing position, request, due): None if not sent

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


class _SendTurns:
    """At most one request sent per event-loop iteration, in arrival order.

    In a burst (a closed loop's start: every lane at once) the loop would otherwise send
    all requests before it reads the sockets again, and chunks arriving meanwhile would
    be timed late by the whole burst; taking turns lets it read between two sends.
    """

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._taken = False

    async def take(self) -> None:
        if self._taken:
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            await turn
        self._taken = True
        asyncio.get_running_loop().call_soon(self._pass)  # runs in the next iteration, after a poll

    def _pass(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # not cancelled
                turn.set_result(None)
                return
        self._taken = False


_IN_FLIGHT = attrgetter("in_flight")


class _Client:
    """Sends one request and records it."""

    def __init__(
        self, endpoints: Sequence[str], model: str, options: LoadOptions, progress: Progress | None, stop: Stop | None = None
    ) -> None:
        self.endpoints = [Endpoint(url, options.api_key) for url in endpoints]
        # the endpoints in round-robin order from each one: ``min`` over them keeps the first of equals
        self.orders = [self.endpoints[k:] + self.endpoints[:k] for k in range(len(self.endpoints))]
        self.least_outstanding = options.routing == "least-outstanding"
        self.model, self.continuous_usage, self.timeout_s = model, options.continuous_usage, options.timeout_s
        self.progress, self.stop = progress, stop
        self.turns = _SendTurns()

    async def send(
        self, position: int, spec: RequestSpec, scheduled_at: float | None, warmup: bool, window: WindowKeeper | None = None
    ) -> RequestRecord | None:
        """Send one request and record it; None when ``window`` was measured before it could be
        written (it waited for its turn or its connection meanwhile): nothing was sent."""
        body = json.dumps(spec.body(self.model, continuous_usage=self.continuous_usage)).encode()
        parser = StreamParser()
        conn: Connection | None = None
        reusable = waited = unsent = False
        prompt_tokens = completion_tokens = 0
        await self.turns.take()
        order = self.orders[position % len(self.orders)]
        endpoint = min(order, key=_IN_FLIGHT) if self.least_outstanding else order[0]
        request = endpoint.head(spec.path, len(body)) + body
        endpoint.in_flight += 1
        sent_at = perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                conn = await endpoint.connection()
                if window is not None and window.cutting:
                    reusable = unsent = True  # the connection is still idle
                    return None
                sent_at = perf_counter()  # TTFT counts from the write, not from connecting
                waited = window is not None and window.sent(sent_at, conn)
                reusable = await conn.request(request, parser)
            if conn.status == 200:
                prompt_tokens, completion_tokens = parser.finish()
            else:
                parser.error = http_error(conn.status, bytes(conn.error_body))
        except TimeoutError:
            parser.error = f"TimeoutError: no complete response within {self.timeout_s} s"
        except Exception as exc:  # anything a server or the network can do must become a record
            parser.error = f"{type(exc).__name__}: {exc}"
        finally:
            endpoint.in_flight -= 1
            if window is not None and conn is not None and not unsent:
                window.ended(conn, waited)
            if reusable and conn is not None:  # reusable implies a connection
                endpoint.idle.append(conn)
            elif conn is not None and conn.transport is not None:
                conn.transport.abort()  # mid-response, timed out or closing: never reuse
        cut = window is not None and conn is not None and parser.error is not None and window.cut(conn)
        if cut:
            parser.error = "cut once its window was measured"
            prompt_tokens, completion_tokens = parser.seen()
        record = RequestRecord(
            index=spec.index,
            endpoint=endpoint.url,
            scheduled_at=sent_at if scheduled_at is None else scheduled_at,
            sent_at=sent_at,
            ended_at=conn.completed_at if conn is not None and conn.completed_at is not None else perf_counter(),
            chunk_times=tuple(parser.times),
            chunk_tokens=tuple(parser.tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            expected_output_tokens=spec.max_tokens if spec.ignore_eos else None,
            expected_prompt_tokens=len(spec.prompt) if isinstance(spec.prompt, tuple) else None,
            status=conn.status if conn is not None else None,
            error=parser.error,
            warmup=warmup,
            cut=cut,
        )
        if self.progress is not None:
            self.progress(record)
        return record

    def close(self) -> None:
        """Close the idle connections: at the end of a run every other one was aborted."""
        for endpoint in self.endpoints:
            endpoint.close()


async def _until(at: float) -> None:
    while (delay := at - perf_counter()) > 0:  # a timer may fire early (uvloop's are in whole ms)
        await asyncio.sleep(delay)


def _sender(
    client: _Client, limit: asyncio.Semaphore | None, deadline: float | None, warmup: bool, window: WindowKeeper | None = None
) -> Send:
    """Sends one request; under an open loop's cap (``limit``), one held back by it past ``deadline``
    is not sent; none is sent once ``window`` is done."""

    async def windowed(position: int, spec: RequestSpec, at: float | None) -> RequestRecord | None:
        if window is not None and window.done():
            return None
        return await client.send(position, spec, at, warmup, window)

    async def send(position: int, spec: RequestSpec, at: float | None) -> RequestRecord | None:
        if limit is None:
            return await windowed(position, spec, at)
        async with limit:
            if deadline is not None and perf_counter() >= deadline:
                return None
            return await windowed(position, spec, at)

    return send


async def _unit(send: Send, unit: Unit, at: float | None, deadline: float | None) -> list[RequestRecord]:
    """Send ``unit``'s requests one after another, the first due ``at`` (None: now, in a closed loop).

    A later turn is due its think time after the previous turn's end, which is its record's
    ``scheduled_at`` (a turn sent late shows as lag); it is not sent when that is past ``deadline``
    or when the previous turn failed, which ends the conversation. While a user thinks nothing is
    in flight: no place under the open loop's cap is held and no endpoint counts it.
    """
    records: list[RequestRecord] = []
    position = unit[0][0]
    for _, spec in unit:
        if records:
            previous = records[-1]
            if not previous.ok:
                break
            at = previous.ended_at + (spec.turn.think_s if spec.turn is not None else 0.0)
            if deadline is not None and at >= deadline:
                break
            await _until(at)
        record = await send(position, spec, at)
        if record is None:
            break
        records.append(record)
    return records


async def _closed(
    send: Send, units: Sequence[Unit], steps: Steps, deadline: float | None, done: Stop | None = None
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


async def _open(
    send: Send, units: Sequence[Unit], offsets: Sequence[float], start: float, deadline: float | None, stop: Stop | None = None
) -> list[asyncio.Task[list[RequestRecord]]]:
    """Start each unit at ``start`` plus its offset, until ``deadline`` or until ``stop`` says so;
    returns once the last has started, with the tasks that send them."""
    tasks = []
    for unit, offset in zip(units, offsets, strict=True):
        at = start + offset
        if deadline is not None and at >= deadline:
            break
        await _until(at)
        if stop is not None and stop():
            break
        tasks.append(asyncio.create_task(_unit(send, unit, at, deadline)))
    return tasks


async def _gathered(tasks: Sequence[asyncio.Task[list[RequestRecord]]]) -> list[RequestRecord]:
    return [record for records in await asyncio.gather(*tasks) for record in records]


def _limit(arrival: Arrival) -> asyncio.Semaphore | None:
    cap = arrival.max_concurrency if isinstance(arrival, OpenLoop) else None
    return asyncio.Semaphore(cap) if cap else None


async def _measured(
    client: _Client, assignment: Assignment, start: float, limit: asyncio.Semaphore | None, lifetime_s: float | None = None
) -> tuple[list[RequestRecord], KeptWindow | None]:
    arrival, duration_s = assignment.arrival, assignment.options.duration_s
    deadline = None if duration_s is None else start + duration_s
    window = keeper_of(assignment, start, lifetime_s)
    send = _sender(client, limit, deadline, False, window)
    done = window.done if window is not None else None
    if isinstance(arrival, ClosedLoop):
        records = await _closed(send, assignment.units, ((0, arrival.concurrency),), deadline, done)
    else:
        assert assignment.offsets is not None
        stops = [stop for stop in (client.stop, done) if stop is not None]
        stop = (lambda: any(s() for s in stops)) if stops else None
        records = await _gathered(await _open(send, assignment.units, assignment.offsets, start, deadline, stop))
    return records, window.kept() if window is not None else None


async def _phased(
    client: _Client, assignment: Assignment, sync: Callable[[], Awaitable[None]] | None
) -> tuple[list[RequestRecord], float, KeptWindow | None]:
    """The warm-up as a closed loop, all of it finished before the measured phase starts."""
    warmup = assignment.warmup
    records = await _closed(_sender(client, None, None, True), warmup, warmup_lanes(assignment.arrival, len(warmup)), None)
    if sync is not None:
        await sync()
    started_at = perf_counter()
    measured, window = await _measured(client, assignment, started_at, _limit(assignment.arrival), lifetime_of(records))
    return records + measured, started_at, window


async def _ramped(client: _Client, assignment: Assignment) -> tuple[list[RequestRecord], float, KeptWindow | None]:
    """An open loop's warm-up at its rising rate, then at once the measured phase at the full rate
    while the warm-up's last requests still run; one cap on requests in flight for both."""
    assert assignment.ramp is not None
    limit = _limit(assignment.arrival)
    start = perf_counter()
    warmup = await _open(_sender(client, limit, None, True), assignment.warmup, assignment.ramp, start, None)
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
    client = _Client(assignment.endpoints, assignment.model, assignment.options, progress, stop)
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
