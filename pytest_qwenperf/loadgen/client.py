"""The load generator's HTTP client: streams requests to vLLM and records what it saw.

Requests are sent according to an :mod:`~pytest_qwenperf.loadgen.arrivals` plan, to the
endpoints by :attr:`LoadOptions.routing`, and each response becomes a
:class:`~pytest_qwenperf.core.records.RequestRecord`.

The client is the instrument, so it is lean: CPU it spends per request or per streamed
chunk delays the timing of every other stream. It speaks HTTP/1.1 itself, on sockets
read through the event loop, rather than through aiohttp. Measured on a 2-vCPU VM with uvloop, aiohttp's
client spends ~450 us of CPU per request and ~32 us per chunk (its body reader wakes a
task for every chunk), which at 256 streams put timing errors of 5-15 ms at p99; this
one spends ~160 us per request and ~19 us per chunk, of which ~5 us is Python and the
rest the kernel's, and times each chunk by when the kernel received it
(:mod:`~pytest_qwenperf.loadgen.stamped_socket`), not when Python got to it. There is
no pool limit, no proxy and no line-length limit to configure.
The connections are :mod:`~pytest_qwenperf.loadgen.http`; :class:`~pytest_qwenperf.loadgen.sse.StreamParser`
reads token counts out of vLLM's chunks without decoding their JSON. This module schedules:
the lanes of a closed loop, the arrivals of an open one, routing, warm-up, and the records.
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

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.loadgen.arrivals import (
    Arrival,
    ClosedLoop,
    OpenLoop,
    Replay,
    requested_rate,
    warmup_concurrency,
)
from pytest_qwenperf.loadgen.http import Connection, Endpoint
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.sse import StreamParser, http_error

DEFAULT_TIMEOUT_S = 600.0
ROUTINGS = ("round-robin", "least-outstanding")

Progress = Callable[[RequestRecord], None]
Job = tuple[int, RequestSpec]  # (position in the workload, request)

@dataclass(frozen=True)
class LoadOptions:
    """How a run is driven, besides what is sent and when.

    ``warmup``: the first this many requests go first, as a closed loop, and are marked
    warm-up. ``duration_s``: stop sending after this long (requests in flight finish and
    count). ``timeout_s`` bounds each request. ``continuous_usage`` asks the server for
    cumulative usage in every chunk, which gives each chunk's token count.

    ``routing`` (one of :data:`ROUTINGS`) picks each request's endpoint. ``"round-robin"``:
    request ``i`` goes to ``endpoints[i % n]``, like a Kubernetes ClusterIP Service.
    ``"least-outstanding"``: to the endpoint with the fewest requests in flight from this
    client when it is sent; ties go to the first in round-robin order from ``i % n``, so
    with equally many in flight everywhere request ``i`` goes where round-robin sends it.
    The client only knows its own requests: with several worker processes
    (:mod:`~pytest_qwenperf.loadgen.workers`) each balances its own share, not the total.

    ``api_key``: sent with every request as ``Authorization: Bearer`` (servers run with
    vLLM's ``--api-key``); its ``repr`` does not show it.
    """

    warmup: int = 0
    duration_s: float | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    continuous_usage: bool = True
    routing: str = "round-robin"
    api_key: ApiKey | None = None

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be at least 0, got {self.warmup}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
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

    def __init__(self, endpoints: Sequence[str], model: str, options: LoadOptions, progress: Progress | None) -> None:
        self.endpoints = [Endpoint(url, options.api_key) for url in endpoints]
        # the endpoints in round-robin order from each one: ``min`` over them keeps the first of equals
        self.orders = [self.endpoints[k:] + self.endpoints[:k] for k in range(len(self.endpoints))]
        self.least_outstanding = options.routing == "least-outstanding"
        self.model, self.continuous_usage, self.timeout_s = model, options.continuous_usage, options.timeout_s
        self.progress = progress
        self.turns = _SendTurns()

    async def send(self, position: int, spec: RequestSpec, scheduled_at: float | None, warmup: bool) -> RequestRecord:
        body = json.dumps(spec.body(self.model, continuous_usage=self.continuous_usage)).encode()
        parser = StreamParser()
        conn: Connection | None = None
        reusable = False
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
                sent_at = perf_counter()  # TTFT counts from the write, not from connecting
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
            if reusable and conn is not None:  # reusable implies a connection
                endpoint.idle.append(conn)
            elif conn is not None and conn.transport is not None:
                conn.transport.abort()  # mid-response, timed out or closing: never reuse
        record = RequestRecord(
            index=spec.index,
            endpoint=endpoint.url,
            scheduled_at=sent_at if scheduled_at is None else scheduled_at,
            sent_at=sent_at,
            ended_at=perf_counter(),
            chunk_times=tuple(parser.times),
            chunk_tokens=tuple(parser.tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            expected_output_tokens=spec.max_tokens if spec.ignore_eos else None,
            expected_prompt_tokens=len(spec.prompt) if isinstance(spec.prompt, tuple) else None,
            status=conn.status if conn is not None else None,
            error=parser.error,
            warmup=warmup,
        )
        if self.progress is not None:
            self.progress(record)
        return record

    def close(self) -> None:
        """Close the idle connections: at the end of a run every other one was aborted."""
        for endpoint in self.endpoints:
            endpoint.close()


async def _closed(
    client: _Client, jobs: Sequence[Job], concurrency: int, deadline: float | None, warmup: bool
) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    queue = iter(jobs)

    async def lane() -> None:
        for position, spec in queue:
            if deadline is not None and perf_counter() >= deadline:
                return
            records.append(await client.send(position, spec, None, warmup))

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(jobs)))))
    return records


async def _open(
    client: _Client,
    jobs: Sequence[Job],
    offsets: Sequence[float],
    max_concurrency: int | None,
    start: float,
    deadline: float | None,
) -> list[RequestRecord]:
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(position: int, spec: RequestSpec, at: float) -> RequestRecord | None:
        if limit is None:
            return await client.send(position, spec, at, False)
        async with limit:
            if deadline is not None and perf_counter() >= deadline:
                return None
            return await client.send(position, spec, at, False)

    tasks = []
    for (position, spec), offset in zip(jobs, offsets, strict=True):
        at = start + offset
        if deadline is not None and at >= deadline:
            break
        while (delay := at - perf_counter()) > 0:  # a timer may fire early (uvloop's are in whole ms)
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(position, spec, at)))
    return [record for record in await asyncio.gather(*tasks) if record is not None]


@dataclass(frozen=True)
class Assignment:
    """What one event loop sends: to which endpoints and as which model, its warm-up and measured
    jobs, by which arrival (``offsets``: the open loop's or the replay's send times for ``jobs``) and how."""

    endpoints: tuple[str, ...]
    model: str
    warmup_jobs: tuple[Job, ...]
    jobs: tuple[Job, ...]
    arrival: Arrival
    offsets: tuple[float, ...] | None
    options: LoadOptions

    @classmethod
    def of(
        cls, endpoints: Sequence[str], model: str, requests: Iterable[RequestSpec], arrival: Arrival, options: LoadOptions
    ) -> Assignment:
        """Number the requests; the first ``options.warmup`` are the warm-up, the open loop's schedule covers the rest."""
        jobs = tuple(enumerate(requests))
        warmup = options.warmup
        if warmup < 0 or warmup > len(jobs):
            raise ValueError(f"warmup must be between 0 and the number of requests ({len(jobs)}), got {warmup}")
        offsets: tuple[float, ...] | None = None
        if isinstance(arrival, OpenLoop):
            offsets = tuple(arrival.offsets(len(jobs) - warmup))
        elif isinstance(arrival, Replay):
            offsets = tuple(arrival.offsets_of([spec.at for _, spec in jobs[warmup:]]))
        return cls(tuple(endpoints), model, jobs[:warmup], jobs[warmup:], arrival, offsets, options)

    @property
    def requested_rate(self) -> float | None:
        return requested_rate(self.arrival, self.offsets)


async def run_jobs(
    assignment: Assignment, *, progress: Progress | None, sync: Callable[[], Awaitable[None]] | None = None
) -> tuple[list[RequestRecord], float, float]:
    """The engine behind :func:`run_load` and each worker: ``(records, started_at, ended_at)``.

    ``sync`` (workers) is awaited before the warm-up and again before the measured phase so
    that all workers start together.
    """
    if not assignment.endpoints:
        raise ValueError("no endpoints")
    arrival, options = assignment.arrival, assignment.options
    client = _Client(assignment.endpoints, assignment.model, options, progress)
    gc.collect()
    gc.freeze()  # a full collection over everything imported stalls the loop for >10 ms; only scan what the run creates
    try:
        if sync is not None:
            await sync()
        warmup = assignment.warmup_jobs
        records = await _closed(client, warmup, warmup_concurrency(arrival, len(warmup)), None, True)
        if sync is not None:
            await sync()
        started_at = perf_counter()
        deadline = None if options.duration_s is None else started_at + options.duration_s
        if isinstance(arrival, ClosedLoop):
            records += await _closed(client, assignment.jobs, arrival.concurrency, deadline, False)
        else:
            assert assignment.offsets is not None
            cap = arrival.max_concurrency if isinstance(arrival, OpenLoop) else None
            records += await _open(client, assignment.jobs, assignment.offsets, cap, started_at, deadline)
        ended_at = perf_counter()
    finally:
        client.close()
        gc.unfreeze()
    records.sort(key=lambda record: record.sent_at)
    return records, started_at, ended_at


async def run_load(
    endpoints: Sequence[str],
    model: str,
    requests: Iterable[RequestSpec],
    arrival: Arrival,
    options: LoadOptions = LoadOptions(),
    *,
    progress: Progress | None = None,
) -> LoadResult:
    """Send ``requests`` to ``endpoints`` (base URLs, chosen per request by ``options.routing``).

    The first ``options.warmup`` requests go first as a closed loop and are marked
    ``warmup``; the measured phase starts when they have all finished and sends the rest
    by ``arrival``, until the workload or ``options.duration_s`` is exhausted (requests in
    flight then finish and count). ``progress`` is called with each finished record.
    """
    assignment = Assignment.of(endpoints, model, requests, arrival, options)
    records, started_at, ended_at = await run_jobs(assignment, progress=progress)
    cpus = (tuple(sorted(os.sched_getaffinity(0))),)
    return LoadResult(tuple(records), started_at, ended_at, arrival, options, cpus, assignment.requested_rate)


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
) -> LoadResult:
    """:func:`run_load` on a fresh event loop (see :func:`new_event_loop`), for callers without one."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(run_load(endpoints, model, requests, arrival, options, progress=progress))
