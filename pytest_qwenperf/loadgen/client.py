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
:class:`StreamParser` reads token counts out of vLLM's chunks without decoding their JSON.
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
from typing import Any
from urllib.parse import urlsplit

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.records import RequestRecord
from pytest_qwenperf.loadgen.arrivals import (
    Arrival,
    ClosedLoop,
    OpenLoop,
    warmup_concurrency,
)
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.stamped_socket import StampedConnection

DEFAULT_TIMEOUT_S = 600.0
ROUTINGS = ("round-robin", "least-outstanding")

Progress = Callable[[RequestRecord], None]
Job = tuple[int, RequestSpec]  # (position in the workload, request)

_COMPLETION_TOKENS = b'"completion_tokens":'
_USAGE = b'"usage"'
_TEXT_KEYS = (b'"text":"', b'"content":"')


def _carries_text(event: bytes) -> bool:
    """Whether a chunk has a non-empty ``text`` (completions) or ``content`` (chat) string, read
    without decoding the JSON. A quote inside a JSON string is escaped, so ``"text":"`` can
    only be that key; the byte after it is the closing quote exactly when the text is empty."""
    for marker in _TEXT_KEYS:
        at = event.find(marker)
        if at >= 0:
            return event[at + len(marker) : at + len(marker) + 1] not in (b'"', b"")
    return False


class StreamParser:
    """Token accounting for one SSE response, fed its body bytes as they arrive.

    Every read is split into events (``data: ...\\n\\n``), all timed at the read. A
    chunk's token count is the step in its cumulative ``usage.completion_tokens`` when the
    server sends continuous usage (known from the first chunk with both usage and
    choices); otherwise each chunk whose choice has output counts as one, and the final
    usage chunk (no choices) only gives the totals. Chunks that carry no tokens (chat's
    role chunk, the final usage chunk) are not kept.

    Fast path without continuous usage: a chunk with no usage whose ``text`` (or chat
    ``content``) is a non-empty string carries one token (:func:`_carries_text`); anything
    else (empty text, reasoning or tool-call deltas, errors, the usage chunk) is decoded.
    Fast path, once usage is known to be continuous: the count is read without decoding
    the JSON. ``"completion_tokens":`` can only occur in valid JSON as that key, unless
    its quote is escaped (preceded by a backslash): inside a string every quote is
    ``\\"``, and a string *ending* right before ``completion_tokens`` would leave bare
    text. vLLM sends the key once, in ``usage``, after the choices; so the last
    occurrence, not after a backslash and followed by digits and ``}``, is the cumulative
    count. Anything else (the first usage, no usage, an error event, a backslash, other
    layouts) goes through ``json.loads``, which costs ten times more.
    """

    __slots__ = ("_continuous", "_rest", "_seen", "_usage", "error", "times", "tokens")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.error: str | None = None
        self._seen = 0  # completion tokens attributed to chunks so far
        self._continuous = False  # a chunk with choices carried usage: every chunk does
        self._usage = b""  # the last event that carried usage
        self._rest = b""  # an incomplete event, waiting for the rest of its bytes

    def feed(self, data: bytes, now: float) -> None:
        if self._rest:
            data = self._rest + data
        events = data.split(b"\n\n")
        self._rest = events.pop()
        tokens = self.tokens
        before, seen = len(tokens), self._seen
        for event in events:
            head, key, tail = event.rpartition(_COMPLETION_TOKENS)
            if key and self._continuous and head[-1:] != b"\\" and (digits := tail.partition(b"}")[0]).isdigit():
                n = int(digits) - seen
                if n > 0:
                    seen += n
                    tokens.append(n)
                self._usage = event
            elif not key and not self._continuous and _USAGE not in event and _carries_text(event):
                seen += 1
                tokens.append(1)
            else:
                self._seen = seen
                self._slow(event)
                seen = self._seen
        self._seen = seen
        self.times += [now] * (len(tokens) - before)

    def _slow(self, event: bytes) -> None:
        if not event.startswith(b"data:"):  # SSE comments (": ping") and other fields
            return
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            self.error = _error_message(chunk)
            return
        usage, choices = chunk.get("usage"), chunk.get("choices")
        if usage:
            self._usage = event
            self._continuous = self._continuous or bool(choices)
        if usage and self._continuous:
            n = (usage.get("completion_tokens") or 0) - self._seen
        elif choices and _has_output(choices[0]):
            n = 1
        else:
            return
        if n > 0:
            self._seen += n
            self.tokens.append(n)

    def finish(self) -> tuple[int, int]:
        """``(prompt_tokens, completion_tokens)`` from the last usage; sets ``error`` if there was none."""
        if self._rest.strip():  # a last event without its blank line: complete at the end of the stream
            self.feed(b"\n\n", perf_counter())
        if not self._usage:
            self.error = self.error or "stream ended without usage"
            return 0, 0
        usage = json.loads(self._usage[self._usage.find(b"{") :])["usage"]
        return usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0


def _has_output(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice carries generated output (completions text or a chat delta)."""
    if choice.get("text"):
        return True
    delta = choice.get("delta") or {}
    return any(delta.get(key) for key in ("content", "reasoning", "reasoning_content", "tool_calls"))


def _error_message(body: Any) -> str:
    """The server's message from vLLM's ``{"error": {"message"}}``, ``{"message"}`` or FastAPI's ``{"detail"}``."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, str):
            return inner
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if key in inner:
                    value = inner[key]
                    return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)


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
    process (one per worker).
    """

    records: tuple[RequestRecord, ...]
    started_at: float
    ended_at: float
    arrival: Arrival
    options: LoadOptions
    client_cpus: tuple[tuple[int, ...], ...]

    def __repr__(self) -> str:
        """Short: asyncio.Runner formats its task's result on exit (Python 3.11), and a full
        repr of every record of a long run costs seconds."""
        return f"LoadResult({len(self.records)} records, {self.ended_at - self.started_at:.3f} s, {self.arrival!r})"

    @property
    def requested_rate(self) -> float | None:
        return self.arrival.rate if isinstance(self.arrival, OpenLoop) else None


class _Connection:
    """One keep-alive HTTP/1.1 connection carrying one request at a time.

    The response is parsed as it arrives: status line and headers, then the body
    (chunked, by ``Content-Length``, or to the end of the connection). A 200's body goes
    straight to the request's :class:`StreamParser`, stamped with when the kernel received
    it (:mod:`~pytest_qwenperf.loadgen.stamped_socket`); any other status's body is kept
    for its error message.
    """

    def __init__(self) -> None:
        self.transport: StampedConnection | None = None
        self.status: int | None = None
        self.error_body = bytearray()
        self._parser: StreamParser | None = None
        self._done: asyncio.Future[bool] | None = None  # result: whether the connection can be reused
        self._buffer = b""
        self._framing = ""  # "chunked", "length" or "close" once the headers are in
        self._left = 0  # body bytes left: of the current chunk plus its CRLF, or of the content length
        self._keep_alive = True

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        conn = cls()
        conn.transport = await StampedConnection.open(host, port, conn)
        return conn

    @property
    def closed(self) -> bool:
        return self.transport is None or self.transport.closed

    def request(self, data: bytes, parser: StreamParser) -> asyncio.Future[bool]:
        """Write a request; the future completes when its response has been read in full."""
        assert self.transport is not None and self._done is None
        self.status, self.error_body, self._parser = None, bytearray(), parser
        self._buffer, self._framing, self._left = b"", "", 0
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._done

    def received(self, data: bytes, at: float) -> None:
        if self._done is None or self._done.done():
            return  # nothing asked for (a late byte after a timeout): the connection is not reused
        try:
            self._receive(self._buffer + data if self._buffer else data, at)
        except Exception as exc:  # a malformed response: fail this request, drop the connection
            self._finish(exc)

    def _receive(self, data: bytes, now: float) -> None:
        pos = 0
        if not self._framing:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._buffer = data
                return
            pos = end + 4
            if not self._head(data[:end]):  # 1xx: the real response follows
                self._receive(data[pos:], now)
                return
        if self._framing == "chunked":
            body, pos, complete = self._chunks(data, pos)
        elif self._framing == "length":
            body, pos = data[pos : pos + self._left], min(len(data), pos + self._left)
            self._left -= len(body)
            complete = self._left == 0
        else:
            body, pos, complete = data[pos:], len(data), False
        self._buffer = data[pos:] if not complete else b""
        if body:
            if self.status == 200:
                assert self._parser is not None
                self._parser.feed(body, now)
            else:
                self.error_body += body
        if complete:
            self._finish(None)

    def _head(self, head: bytes) -> bool:
        """Take in the status line and headers; False for an interim (1xx) response."""
        lines = head.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        self.status = int(status)
        if self.status < 200:
            return False
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self._keep_alive = headers.get(b"connection", b"close" if version == b"HTTP/1.0" else b"") != b"close"
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self._framing = "chunked"
        elif b"content-length" in headers:
            self._framing, self._left = "length", int(headers[b"content-length"])
        else:
            self._framing, self._keep_alive = "close", False
        return True

    def _chunks(self, data: bytes, pos: int) -> tuple[bytes, int, bool]:
        """Decode HTTP chunks from ``pos``: (payload, where decoding stopped, whether the body ended)."""
        payload, end, left = [], len(data), self._left
        if left:  # the rest of a chunk begun in an earlier read (``left`` counts its CRLF too)
            take = min(left, end - pos)
            payload.append(data[pos : pos + max(0, min(take, left - 2))])
            pos, left = pos + take, left - take
        while not left and (eol := data.find(b"\r\n", pos)) >= 0:
            try:
                size = int(data[pos:eol], 16)
            except ValueError:  # a chunk extension
                size = int(data[pos:eol].partition(b";")[0], 16)
            if size == 0:  # the last chunk: then optional trailers and a blank line
                stop = eol + 2 if data.startswith(b"\r\n", eol + 2) else data.find(b"\r\n\r\n", eol + 2) + 2
                if stop < eol + 2:
                    break
                return b"".join(payload), stop + 2, True
            start, pos = eol + 2, eol + 4 + size
            payload.append(data[start : start + size])
            if pos > end:  # the chunk continues in the next read
                left, pos = pos - end, end
        self._left = left
        return b"".join(payload), pos, False

    def _finish(self, error: Exception | None) -> None:
        done, self._done = self._done, None
        if error is not None and self.transport is not None:
            self.transport.abort()
        if done is not None and not done.done():
            if error is None:
                done.set_result(self._keep_alive and not self.closed)
            else:
                done.set_exception(error)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is None or self._done.done():
            return
        if exc is None and self._framing == "close":  # the body ran to the end of the connection
            self._finish(None)
        else:
            reason = f" ({type(exc).__name__}: {exc})" if exc else ""
            self._finish(ConnectionError(f"connection closed before the response was complete{reason}"))


class _Endpoint:
    """A base URL (``http://host:port[/prefix]``), its idle keep-alive connections and how many
    of this client's requests to it are in flight."""

    def __init__(self, url: str, api_key: ApiKey | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"endpoint must be an http:// URL, got {url!r}")
        self.url, self.host, self.port = url, parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.auth = api_key.header_line() if api_key else ""
        self.idle: list[_Connection] = []
        self.in_flight = 0

    def head(self, path: str, length: int) -> bytes:
        return (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUser-Agent: pytest-qwenperf\r\n"
            f"{self.auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        ).encode()

    async def connection(self) -> _Connection:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return await _Connection.open(self.host, self.port)

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.abort()
        self.idle.clear()


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
        self.endpoints = [_Endpoint(url, options.api_key) for url in endpoints]
        # the endpoints in round-robin order from each one: ``min`` over them keeps the first of equals
        self.orders = [self.endpoints[k:] + self.endpoints[:k] for k in range(len(self.endpoints))]
        self.least_outstanding = options.routing == "least-outstanding"
        self.model, self.continuous_usage, self.timeout_s = model, options.continuous_usage, options.timeout_s
        self.progress = progress
        self.turns = _SendTurns()

    async def send(self, position: int, spec: RequestSpec, scheduled_at: float | None, warmup: bool) -> RequestRecord:
        body = json.dumps(spec.body(self.model, continuous_usage=self.continuous_usage)).encode()
        parser = StreamParser()
        conn: _Connection | None = None
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
                parser.error = _http_error(conn.status, bytes(conn.error_body))
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


def _http_error(status: int | None, body: bytes) -> str:
    try:
        return _error_message(json.loads(body))
    except ValueError:
        return body.decode(errors="replace").strip() or f"HTTP {status}"


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


async def run_jobs(
    endpoints: Sequence[str],
    model: str,
    warmup_jobs: Sequence[Job],
    jobs: Sequence[Job],
    arrival: Arrival,
    offsets: Sequence[float] | None,
    options: LoadOptions,
    *,
    progress: Progress | None,
    sync: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[RequestRecord], float, float]:
    """The engine behind :func:`run_load` and each worker: ``(records, started_at, ended_at)``.

    ``offsets`` are the open loop's send times for ``jobs``; ``sync`` (workers) is awaited
    before the warm-up and again before the measured phase so that all workers start together.
    """
    if not endpoints:
        raise ValueError("no endpoints")
    client = _Client(endpoints, model, options, progress)
    gc.collect()
    gc.freeze()  # a full collection over everything imported stalls the loop for >10 ms; only scan what the run creates
    try:
        if sync is not None:
            await sync()
        records = await _closed(client, warmup_jobs, warmup_concurrency(arrival, len(warmup_jobs)), None, True)
        if sync is not None:
            await sync()
        started_at = perf_counter()
        deadline = None if options.duration_s is None else started_at + options.duration_s
        if isinstance(arrival, ClosedLoop):
            records += await _closed(client, jobs, arrival.concurrency, deadline, False)
        else:
            assert offsets is not None
            records += await _open(client, jobs, offsets, arrival.max_concurrency, started_at, deadline)
        ended_at = perf_counter()
    finally:
        client.close()
        gc.unfreeze()
    records.sort(key=lambda record: record.sent_at)
    return records, started_at, ended_at


def split_warmup(
    requests: Iterable[RequestSpec], arrival: Arrival, warmup: int
) -> tuple[list[Job], list[Job], list[float] | None]:
    """Number the requests; the first ``warmup`` are the warm-up, the open loop's schedule covers the rest."""
    jobs = list(enumerate(requests))
    if warmup < 0 or warmup > len(jobs):
        raise ValueError(f"warmup must be between 0 and the number of requests ({len(jobs)}), got {warmup}")
    offsets = arrival.offsets(len(jobs) - warmup) if isinstance(arrival, OpenLoop) else None
    return jobs[:warmup], jobs[warmup:], offsets


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
    warmup_jobs, jobs, offsets = split_warmup(requests, arrival, options.warmup)
    records, started_at, ended_at = await run_jobs(
        endpoints, model, warmup_jobs, jobs, arrival, offsets, options, progress=progress
    )
    cpus = (tuple(sorted(os.sched_getaffinity(0))),)
    return LoadResult(tuple(records), started_at, ended_at, arrival, options, cpus)


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
