"""Sending one request and recording it: routed to an endpoint, written on a keep-alive
connection (:mod:`~pytest_qwenperf.loadgen.http`), its stream read into a
:class:`~pytest_qwenperf.core.records.RequestRecord`. When to send is
:mod:`~pytest_qwenperf.loadgen.client`'s.

A request due at a time (an open loop's, a replay's) is made ready before it (:meth:`Requester.ahead`:
its JSON built, a connection opened), so that at its time only the write is left
(:meth:`Requester.write_now`), and a burst due in one millisecond is written in one go before any
of its responses is awaited. A request's lag is the time from its scheduled instant to that write
(``RequestRecord.sent_at``), when its first byte is handed to the kernel.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from time import perf_counter

from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.loadgen.assignment import LoadOptions, Unit
from pytest_qwenperf.loadgen.http import Connection, Endpoint
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.sse import StreamParser, http_error
from pytest_qwenperf.loadgen.window_keeper import WindowKeeper

Progress = Callable[[RequestRecord], None]
Stop = Callable[[], bool]
"""Asked before each measured send of an open loop or a replay: True ends the sending, and the
requests in flight are cut (:meth:`Requester.cut_in_flight`, :data:`STOPPED`), as a capacity
search stops a probe that is clearly over-saturated."""

STOPPED = "cut once the run was stopped"
"""Why a request was cut when its run was stopped (:data:`Stop`)."""

_IN_FLIGHT = attrgetter("in_flight")


class SendTurns:
    """At most one unscheduled request sent per event-loop iteration, in arrival order.

    In a closed loop's start (every lane at once) the loop would otherwise build and send all
    requests before it reads the sockets again; taking turns lets it read between two sends. A
    request due at a time takes no turn: it was built ahead and only its write is left.
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


@dataclass
class Written:
    """A request on its way: where it went, when it was written, and the response being read
    (``done``: None where no connection could be had; ``error`` says why)."""

    endpoint: Endpoint
    conn: Connection | None
    parser: StreamParser
    sent_at: float
    waited: bool = False  # a time-bounded load's window waits for its end
    done: asyncio.Future[bool] | None = None  # its result: whether the connection can be reused
    error: str | None = None


class Requester:
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
        self.turns = SendTurns()
        self.bodies: dict[int, bytes] = {}  # built ahead (:meth:`ahead`), by id of the request
        self.live: set[Connection] = set()  # the connections of the requests in flight
        self.cut_off: dict[Connection, str] = {}  # the connections cut, and why
        self.halted = False  # once a cut: nothing more is written

    def _encoded(self, spec: RequestSpec) -> bytes:
        return json.dumps(spec.body(self.model, continuous_usage=self.continuous_usage)).encode()

    def _body(self, spec: RequestSpec) -> bytes:
        """The request's JSON body: built ahead of its time where it was, else now."""
        built = self.bodies.pop(id(spec), None)
        return built if built is not None else self._encoded(spec)

    def _endpoint(self, position: int) -> Endpoint:
        order = self.orders[position % len(self.orders)]
        return min(order, key=_IN_FLIGHT) if self.least_outstanding else order[0]

    def ahead(self, units: Sequence[Unit]) -> None:
        """Make ready what ``units``, due soon, will need at their time: their first requests' bodies,
        and on each endpoint as many idle connections as requests are due to it (opened in the
        background), so that a send waits neither on JSON nor on a connect."""
        due: dict[Endpoint, int] = defaultdict(int)
        for unit in units:
            position, spec = unit[0]
            if id(spec) not in self.bodies:
                self.bodies[id(spec)] = self._encoded(spec)
            due[self.orders[position % len(self.orders)][0]] += 1  # least-outstanding may route elsewhere: a guess
        for endpoint, count in due.items():
            endpoint.open_ahead(count)

    async def ready(self, units: Sequence[Unit]) -> None:
        """:meth:`ahead`, and wait until the connections it opens are open."""
        self.ahead(units)
        await asyncio.gather(*(task for endpoint in self.endpoints for task in list(endpoint.opening)))

    def cut_in_flight(self, why: str) -> None:
        """Write nothing more, and cut the requests in flight (their connections closed, which vLLM
        takes as an abort; their records are ``cut`` with ``why``, not failures). The run was
        stopped (:data:`STOPPED`): a load clearly too much for the server is told by what was sent
        so far, and waiting for the ends of a queue that kept growing would take as long again; or
        its window was measured (:class:`WindowKeeper`), and nothing of these requests lies inside it."""
        self.halted = True
        for conn in self.live - self.cut_off.keys():
            self.cut_off[conn] = why
            conn.cut()

    def write_now(self, position: int, spec: RequestSpec, window: WindowKeeper | None) -> Written | None:
        """Write the request at once on an idle connection; None where none is idle, or the run is
        being cut (the caller then sends it as any other, or not at all)."""
        endpoint = self._endpoint(position)
        conn = endpoint.idle_connection()
        if conn is None:
            return None
        if self.halted:
            endpoint.idle.append(conn)
            return None
        endpoint.in_flight += 1
        return self._write(endpoint, conn, spec, self._body(spec), window)

    def _write(self, endpoint: Endpoint, conn: Connection, spec: RequestSpec, body: bytes, window: WindowKeeper | None) -> Written:
        """Write on ``conn``, the request counted in flight on ``endpoint`` already."""
        request = endpoint.head(spec.path, len(body)) + body
        parser = StreamParser()
        sent_at = perf_counter()  # TTFT counts from the write, not from connecting
        waited = window is not None and window.sent(sent_at)
        self.live.add(conn)
        return Written(endpoint, conn, parser, sent_at, waited, conn.request(request, parser))

    async def _connected(self, position: int, spec: RequestSpec, window: WindowKeeper | None) -> Written | None:
        """Write the request once a connection is had; None when the run was cut meanwhile
        (:meth:`cut_in_flight`): nothing was sent."""
        body = self._body(spec)
        endpoint = self._endpoint(position)
        endpoint.in_flight += 1  # from its routing: least-outstanding counts a request that is still connecting
        started = perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                conn = await endpoint.connection()
        except Exception as exc:  # anything a server or the network can do must become a record
            endpoint.in_flight -= 1
            why = f"no connection within {self.timeout_s} s" if isinstance(exc, TimeoutError) else str(exc)
            return Written(endpoint, None, StreamParser(), started, error=f"{type(exc).__name__}: {why}")
        if self.halted:
            endpoint.in_flight -= 1
            endpoint.idle.append(conn)  # still idle
            return None
        return self._write(endpoint, conn, spec, body, window)

    async def send(
        self,
        position: int,
        spec: RequestSpec,
        scheduled_at: float | None,
        warmup: bool,
        window: WindowKeeper | None = None,
        written: Written | None = None,
    ) -> RequestRecord | None:
        """Send one request (``written``: it was written already, :meth:`write_now`) and record it;
        None when the run was cut before it could be written (:meth:`cut_in_flight`): nothing was sent."""
        if written is None:
            if scheduled_at is None:
                await self.turns.take()
            written = await self._connected(position, spec, window)
            if written is None:
                return None
        return self._recorded(await self._answered(written, window), spec, scheduled_at, warmup)

    async def _answered(self, written: Written, window: WindowKeeper | None) -> tuple[Written, int, int, bool]:
        """Read the response: (the request, prompt tokens, completion tokens, whether it was cut)."""
        conn, parser, endpoint = written.conn, written.parser, written.endpoint
        parser.error = written.error
        prompt_tokens = completion_tokens = 0
        if written.done is None or conn is None:
            return written, 0, 0, False
        reusable = False
        try:
            async with asyncio.timeout(self.timeout_s):
                reusable = await written.done
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
            self.live.discard(conn)
            if window is not None:
                window.ended(written.waited)
            if reusable:
                endpoint.idle.append(conn)
            elif conn.transport is not None:
                conn.transport.abort()  # mid-response, timed out or closing: never reuse
        why = self.cut_off.get(conn)
        cut = parser.error is not None and why is not None
        if cut:
            parser.error = why
            prompt_tokens, completion_tokens = parser.seen()
        return written, prompt_tokens, completion_tokens, cut

    def _recorded(self, answered: tuple[Written, int, int, bool], spec: RequestSpec, scheduled_at: float | None, warmup: bool) -> RequestRecord:
        written, prompt_tokens, completion_tokens, cut = answered
        conn, parser = written.conn, written.parser
        record = RequestRecord(
            index=spec.index,
            endpoint=written.endpoint.url,
            scheduled_at=written.sent_at if scheduled_at is None else scheduled_at,
            sent_at=written.sent_at,
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
