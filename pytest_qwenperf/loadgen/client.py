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
import math
import os
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import attrgetter
from time import perf_counter

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.core.run import WorkerClock
from pytest_qwenperf.core.window import KeptWindow, Window
from pytest_qwenperf.loadgen.arrivals import (
    Arrival,
    ClosedLoop,
    OpenLoop,
    Replay,
    Steps,
    requested_rate,
    warmup_lanes,
    window_problem,
)
from pytest_qwenperf.loadgen.http import Connection, Endpoint
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.sse import StreamParser, http_error

DEFAULT_TIMEOUT_S = 600.0
ROUTINGS = ("round-robin", "least-outstanding")

Progress = Callable[[RequestRecord], None]
Stop = Callable[[], bool]
"""Asked before each measured send of an open loop or a replay: True ends the sending (requests in
flight finish and count), as a capacity search stops a probe that is clearly over-saturated."""
Job = tuple[int, RequestSpec]  # (position in the workload, request)
Unit = tuple[Job, ...]  # what is sent as one: a request on its own, or a conversation's turns in order
Send = Callable[[int, RequestSpec, float | None], Awaitable[RequestRecord | None]]  # (routing position, request, due): None if not sent

@dataclass(frozen=True)
class LoadOptions:
    """How a run is driven, besides what is sent and when.

    ``warmup``: the first this many requests go first, as a closed loop (an open loop's
    ``ramp``: at its rising rate), and are marked warm-up; with conversations they must be
    whole ones. ``duration_s``: stop sending after this long (requests in flight finish and
    count; no later turn of a conversation is sent past it). ``window``: measure for this long
    once the batch is full, instead (:mod:`~pytest_qwenperf.core.window`); the requests are then
    a supply the window must not exhaust. ``timeout_s`` bounds each request. ``continuous_usage`` asks the server for
    cumulative usage in every chunk, which gives each chunk's token count.

    ``routing`` (one of :data:`ROUTINGS`) picks each request's endpoint. ``"round-robin"``:
    request ``i`` goes to ``endpoints[i % n]``, like a Kubernetes ClusterIP Service.
    ``"least-outstanding"``: to the endpoint with the fewest requests in flight from this
    client when it is sent; ties go to the first in round-robin order from ``i % n``, so
    with equally many in flight everywhere request ``i`` goes where round-robin sends it.
    Every turn of a conversation is routed by its first turn's position: round-robin keeps a
    conversation on one endpoint, whose prefix cache holds its earlier turns (least-outstanding
    still picks per turn). The client only knows its own requests: with several worker processes
    (:mod:`~pytest_qwenperf.loadgen.workers`) each balances its own share, not the total.

    ``api_key``: sent with every request as ``Authorization: Bearer`` (servers run with
    vLLM's ``--api-key``); its ``repr`` does not show it.
    """

    warmup: int = 0
    duration_s: float | None = None
    window: Window | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    continuous_usage: bool = True
    routing: str = "round-robin"
    api_key: ApiKey | None = None

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {self.warmup}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        if self.duration_s is not None and self.window is not None:
            raise ValueError("a load is bounded by a duration or measured for a window, not both")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")


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
        self, position: int, spec: RequestSpec, scheduled_at: float | None, warmup: bool, window: _WindowKeeper | None = None
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


class _WindowKeeper:
    """Keeps a time-bounded run's window while it runs (:mod:`~pytest_qwenperf.core.window`).

    A closed loop's window opens once its batch has filled and turned over once: at the end of
    as many measured requests as it has lanes (``turnover``). The measured phase starts from an
    empty batch (the warm-up ended first), so its first wave is sent at once and runs in step,
    all prefills together and then decoding alone; only after it has turned over do the slots
    hold requests at every stage, as they do in a steady state. An open loop's opens at
    ``opens_at``. It closes ``length_s`` later. Every request
    sent before it closes is counted until it ends, and the run sends on while any is in flight.
    Once none is (:meth:`done`), the requests still in flight, all sent after the window closed,
    are cut: their connections closed, which vLLM takes as an abort. Nothing of them lies inside
    the window, so waiting for their ends would only cost time (a whole request's lifetime).
    Sends are counted at their write (the records' ``sent_at``), not when a lane asks to send: a
    closed loop's lanes all ask at once and write one per loop turn (``_SendTurns``), so a request
    counts as inside the window by the same time its record has.
    """

    def __init__(
        self, length_s: float, lifetime_s: float | None, supply: int, turnover: int | None, opens_at: float | None
    ) -> None:
        self.length_s, self.lifetime_s = length_s, lifetime_s  # the lifetime it was reckoned in; None: seconds
        self.supply = supply  # the measured requests: once all were sent, the requests ran out
        self.turnover, self.opened = turnover, opens_at
        self.sends = self.ends = 0
        self.waiting = 0  # requests sent before the window closed, not yet ended
        self.last_send = -math.inf
        self.live: set[Connection] = set()  # the connections of the requests in flight
        self.cut_off: set[Connection] = set()  # those cut once the window was measured
        self.cutting = False

    @property
    def closes(self) -> float:
        return math.inf if self.opened is None else self.opened + self.length_s

    def sent(self, at: float, conn: Connection) -> bool:
        """A request was written at ``at`` on ``conn``; True when the window waits for it to end.
        Its end is told to :meth:`ended` either way."""
        self.live.add(conn)
        self.sends += 1
        self.last_send = at
        if at < self.closes:
            self.waiting += 1
            return True
        return False

    def ended(self, conn: Connection, waited: bool) -> None:
        self.live.discard(conn)
        self.waiting -= waited
        self.ends += 1
        if self.opened is None and self.ends == self.turnover:
            self.opened = perf_counter()
        if waited and not self.waiting:
            self.done()

    def done(self) -> bool:
        """The window has closed and every request it waits for has ended: send no more, and cut
        the requests in flight."""
        if self.waiting or perf_counter() < self.closes:
            return False
        self.cutting = True
        for conn in self.live - self.cut_off:
            self.cut_off.add(conn)
            conn.cut()
        return True

    def cut(self, conn: Connection) -> bool:
        """Whether the request on ``conn`` ended because it was cut."""
        return conn in self.cut_off

    def kept(self) -> KeptWindow | None:
        """The window measured; it closes at the last send where the requests ran out first. None where
        it never opened, or nothing was sent once it had."""
        if self.opened is None:
            return None
        ran_out = self.sends >= self.supply and self.last_send < self.closes
        if ran_out and self.last_send <= self.opened:  # nothing was sent once it opened: no window at all
            return None
        closed = self.last_send if ran_out else self.closes
        return KeptWindow(self.opened, closed, self.length_s, self.lifetime_s, ran_out)


async def _until(at: float) -> None:
    while (delay := at - perf_counter()) > 0:  # a timer may fire early (uvloop's are in whole ms)
        await asyncio.sleep(delay)


def _sender(
    client: _Client, limit: asyncio.Semaphore | None, deadline: float | None, warmup: bool, window: _WindowKeeper | None = None
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


def _units(jobs: Iterable[Job]) -> tuple[Unit, ...]:
    """The jobs grouped into what is sent as one, in the order of their first jobs.

    Turn 0 opens a conversation; turn k joins the earliest opened conversation of its number that
    waits for turn k. So conversation numbers need not be unique: copies of a workload interleaved
    request by request (one per replica, ``measure.scaling.copies_of``) repeat them.
    """
    units: list[list[Job]] = []
    waiting: defaultdict[tuple[int, int], deque[list[Job]]] = defaultdict(deque)  # (conversation, turn it waits for)
    for job in jobs:
        turn = job[1].turn
        if turn is None or turn.number == 0:
            unit = [job]
            units.append(unit)
        elif waiting[turn.conversation, turn.number]:
            unit = waiting[turn.conversation, turn.number].popleft()
            unit.append(job)
        else:
            raise ValueError(
                f"request {job[0]}: turn {turn.number} of conversation {turn.conversation} comes without turn {turn.number - 1} before it"
            )
        if turn is not None:
            waiting[turn.conversation, turn.number + 1].append(unit)
    return tuple(tuple(unit) for unit in units)


def _warmup_units(units: Sequence[Unit], warmup: int) -> int:
    """How many units the first ``warmup`` requests make: they must be whole conversations."""
    ends = list(accumulate((len(unit) for unit in units), initial=0))  # the requests before each unit, and all
    if warmup < 0 or warmup > ends[-1]:
        raise ValueError(f"warmup must be between 0 and the number of requests ({ends[-1]}), got {warmup}")
    k = bisect_left(ends, warmup)
    if ends[k] != warmup:
        raise ValueError(f"warmup must be whole conversations, {ends[k - 1]} or {ends[k]} requests here, got {warmup}")
    return k


def _limit(arrival: Arrival) -> asyncio.Semaphore | None:
    cap = arrival.max_concurrency if isinstance(arrival, OpenLoop) else None
    return asyncio.Semaphore(cap) if cap else None


@dataclass(frozen=True)
class Assignment:
    """What one event loop sends: to which endpoints and as which model, its warm-up and measured
    units, by which arrival and how. ``offsets``: the open loop's or the replay's send times of
    ``units``; ``ramp``: an open loop's ramp's send times of the ``warmup`` units, and ``ramp_s``
    the whole ramp's length (a worker's share keeps it), where the measured phase starts."""

    endpoints: tuple[str, ...]
    model: str
    warmup: tuple[Unit, ...]
    units: tuple[Unit, ...]
    arrival: Arrival
    offsets: tuple[float, ...] | None
    options: LoadOptions
    ramp: tuple[float, ...] | None = None
    ramp_s: float = 0.0

    @classmethod
    def of(
        cls, endpoints: Sequence[str], model: str, requests: Iterable[RequestSpec], arrival: Arrival, options: LoadOptions
    ) -> Assignment:
        """Number the requests and group a conversation's turns into one unit; the first
        ``options.warmup`` requests are the warm-up, the arrival's schedule covers the rest."""
        units = _units(enumerate(requests))
        warmup = _warmup_units(units, options.warmup)
        if options.window is not None and (problem := window_problem(options.window, arrival, warmup)):
            raise ValueError(problem)
        measured = units[warmup:]
        offsets: tuple[float, ...] | None = None
        if isinstance(arrival, OpenLoop):
            offsets = tuple(arrival.offsets(len(measured)))
        elif isinstance(arrival, Replay):
            offsets = tuple(arrival.offsets_of([unit[0][1].at for unit in measured]))
        ramp = tuple(arrival.ramp_offsets(warmup)) if isinstance(arrival, OpenLoop) and arrival.ramp is not None else None
        return cls(tuple(endpoints), model, units[:warmup], measured, arrival, offsets, options, ramp, ramp[-1] if ramp else 0.0)

    @property
    def requested_rate(self) -> float | None:
        """The arrival's; None when conversations of several turns are sent: how fast the server
        answers sets their request rate (their turns' lag still shows a client that fell behind)."""
        if any(len(unit) > 1 for unit in self.units):
            return None
        return requested_rate(self.arrival, self.offsets)


def _keeper(assignment: Assignment, start: float, lifetime_s: float | None) -> _WindowKeeper | None:
    """The measured phase's window keeper, or None when the load is not time-bounded. A closed loop's
    window opens once its batch has turned over; an open loop's one lifetime after the measured
    phase starts, or at once after a ramp (whose requests are in flight already)."""
    window = assignment.options.window
    if window is None:
        return None
    length_s = window.length_s(lifetime_s)
    reckoned_in = lifetime_s if window.lifetimes is not None else None
    supply = sum(map(len, assignment.units))
    if isinstance(assignment.arrival, ClosedLoop):
        return _WindowKeeper(length_s, reckoned_in, supply, min(assignment.arrival.concurrency, len(assignment.units)), None)
    opens_at = start if assignment.ramp is not None else start + (lifetime_s or 0.0)
    return _WindowKeeper(length_s, reckoned_in, supply, None, opens_at)


def _lifetime_s(warmup: Sequence[RequestRecord]) -> float | None:
    """A request's lifetime: the median end-to-end time of the warm-up's completed requests."""
    times = sorted(r.ended_at - r.sent_at for r in warmup if r.ok)
    return times[len(times) // 2] if times else None


async def _measured(
    client: _Client, assignment: Assignment, start: float, limit: asyncio.Semaphore | None, lifetime_s: float | None = None
) -> tuple[list[RequestRecord], KeptWindow | None]:
    arrival, duration_s = assignment.arrival, assignment.options.duration_s
    deadline = None if duration_s is None else start + duration_s
    window = _keeper(assignment, start, lifetime_s)
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
    measured, window = await _measured(client, assignment, started_at, _limit(assignment.arrival), _lifetime_s(records))
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
