"""The load generator's HTTP client: streams requests to vLLM and records what it saw.

One shared ``aiohttp`` session with no connection cap sends the workload's requests
according to an :mod:`~pytest_qwenperf.loadgen.arrivals` plan, round-robin over the
endpoints, and turns each response into a :class:`~pytest_qwenperf.records.RequestRecord`.

The client is the instrument, so it is kept lean: CPU spent here per streamed chunk is
CPU not spent receiving the next one on time. :class:`StreamParser` reads token counts
out of vLLM's chunks without decoding their JSON (see its docstring).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import aiohttp
from yarl import URL

from pytest_qwenperf.loadgen.arrivals import Arrival, ClosedLoop, OpenLoop, warmup_concurrency
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.records import RequestRecord

READ_BUFSIZE = 4 * 2**20  # one response's buffer: long contexts make long chunks (prompt echo, logprobs)
DEFAULT_TIMEOUT_S = 600.0

Progress = Callable[[RequestRecord], None]
Job = tuple[int, RequestSpec]  # (position in the workload, request)

_COMPLETION_TOKENS = b'"completion_tokens":'
_JSON_HEADERS = {"Content-Type": "application/json"}
_PATHS = ("/v1/completions", "/v1/chat/completions")  # RequestSpec.path


class StreamParser:
    """Token accounting for one SSE response, fed its body bytes as they arrive.

    Every read is split into events (``data: ...\\n\\n``), all timed at the read. A
    chunk's token count is the step in its cumulative ``usage.completion_tokens`` when the
    server sends continuous usage; otherwise each chunk whose choice has output counts as
    one. Chunks that carry no tokens (chat's role chunk, the final usage chunk) are not kept.

    Fast path: the count is read without decoding the JSON. ``"completion_tokens":`` can
    only occur in valid JSON as that key, unless its quote is escaped (preceded by a
    backslash): inside a string every quote is ``\\"``, and a string *ending* right before
    ``completion_tokens`` would leave bare text. vLLM sends the key once, in ``usage``,
    after the choices; so the last occurrence, not after a backslash and followed by
    digits and ``}``, is the cumulative count. Anything else (no usage, an error event, a
    backslash, other layouts) goes through ``json.loads``, which costs ten times more.
    """

    __slots__ = ("times", "tokens", "error", "_seen", "_plain", "_usage", "_rest")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.error: str | None = None
        self._seen = 0  # completion tokens attributed to chunks so far
        self._plain = False  # the server sends no continuous usage: count chunks instead
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
            if key and not self._plain and not head.endswith(b"\\") and (digits := tail.partition(b"}")[0]).isdigit():
                n = int(digits) - seen
                if n > 0:
                    seen += n
                    tokens.append(n)
                self._usage = event
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
        if usage and not self._plain:
            n = (usage.get("completion_tokens") or 0) - self._seen
        elif choices and _has_output(choices[0]):
            n, self._plain = 1, True
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
        usage = json.loads(self._usage[5:])["usage"]
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
    warmup: int
    duration_s: float | None
    client_cpus: tuple[tuple[int, ...], ...]

    @property
    def requested_rate(self) -> float | None:
        return self.arrival.rate if isinstance(self.arrival, OpenLoop) else None

    @property
    def requested_concurrency(self) -> int | None:
        return self.arrival.concurrency if isinstance(self.arrival, ClosedLoop) else self.arrival.max_concurrency


async def _on_request_sent(session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestChunkSentParams) -> None:
    """Stamp ``sent_at`` as the body goes to the socket.

    On Python < 3.12 aiohttp writes the body from a separate task, so a burst of requests
    is written only after all of them were prepared: timing from the ``post()`` call would
    add the client's own backlog (tens of ms for hundreds of requests) to every TTFT.
    """
    context.trace_request_ctx.append(perf_counter())


class _SendTurns:
    """At most one request sent per event-loop iteration, in arrival order.

    Sending a request costs aiohttp hundreds of microseconds of CPU. In a burst (a closed
    loop's start: every lane at once) the loop would send them all before it polls the
    sockets again, and chunks arriving meanwhile would be timed late by the whole burst;
    taking turns lets the loop read (and time) responses between two sends.
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


class _Client:
    """Sends one request and records it."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        endpoints: Sequence[str],
        model: str,
        continuous_usage: bool,
        timeout_s: float,
        progress: Progress | None,
    ) -> None:
        self.session, self.model, self.timeout_s = session, model, timeout_s
        self.endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self.urls = {(endpoint, path): URL(endpoint + path) for endpoint in self.endpoints for path in _PATHS}
        self.continuous_usage, self.progress = continuous_usage, progress
        self.turns = _SendTurns()

    async def send(self, position: int, spec: RequestSpec, scheduled_at: float | None, warmup: bool) -> RequestRecord:
        endpoint = self.endpoints[position % len(self.endpoints)]
        body = json.dumps(spec.body(self.model, continuous_usage=self.continuous_usage)).encode()
        parser = StreamParser()
        status: int | None = None
        prompt_tokens = completion_tokens = 0
        url = self.urls[endpoint, spec.path]
        await self.turns.take()
        sent = [perf_counter()]  # then the time the request is actually written, see _on_request_sent
        try:
            async with self.session.post(url, data=body, headers=_JSON_HEADERS, trace_request_ctx=sent) as resp:
                status = resp.status
                if status != 200:
                    raw = await resp.read()
                    try:
                        parser.error = _error_message(json.loads(raw))
                    except ValueError:
                        parser.error = raw.decode(errors="replace").strip() or f"HTTP {status} {resp.reason}"
                else:
                    content, feed = resp.content, parser.feed
                    while data := await content.readany():
                        feed(data, perf_counter())
                    prompt_tokens, completion_tokens = parser.finish()
        except TimeoutError:
            parser.error = f"TimeoutError: no complete response within {self.timeout_s} s"
        except Exception as exc:  # anything a server or the network can do must become a record
            parser.error = f"{type(exc).__name__}: {exc}"
        sent_at = sent[-1]
        record = RequestRecord(
            index=spec.index,
            endpoint=endpoint,
            scheduled_at=sent_at if scheduled_at is None else scheduled_at,
            sent_at=sent_at,
            ended_at=perf_counter(),
            chunk_times=tuple(parser.times),
            chunk_tokens=tuple(parser.tokens),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            expected_output_tokens=spec.max_tokens if spec.ignore_eos else None,
            status=status,
            error=parser.error,
            warmup=warmup,
        )
        if self.progress is not None:
            self.progress(record)
        return record


async def _closed(client: _Client, jobs: Sequence[Job], concurrency: int, deadline: float | None, warmup: bool) -> list[RequestRecord]:
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
    client: _Client, jobs: Sequence[Job], offsets: Sequence[float], max_concurrency: int | None, start: float, deadline: float | None
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
    *,
    duration_s: float | None,
    timeout_s: float,
    continuous_usage: bool,
    progress: Progress | None,
    sync: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[RequestRecord], float, float]:
    """The engine behind :func:`run_load` and each worker: ``(records, started_at, ended_at)``.

    ``offsets`` are the open loop's send times for ``jobs``; ``sync`` (workers) is awaited
    before the warm-up and again before the measured phase so that all workers start together.
    """
    if not endpoints:
        raise ValueError("no endpoints")
    sent_trace = aiohttp.TraceConfig()
    sent_trace.on_request_chunk_sent.append(_on_request_sent)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        trust_env=False,
        read_bufsize=READ_BUFSIZE,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[sent_trace],
    )
    async with session:
        client = _Client(session, endpoints, model, continuous_usage, timeout_s, progress)
        if sync is not None:
            await sync()
        records = await _closed(client, warmup_jobs, warmup_concurrency(arrival, len(warmup_jobs)), None, True)
        if sync is not None:
            await sync()
        started_at = perf_counter()
        deadline = None if duration_s is None else started_at + duration_s
        if isinstance(arrival, ClosedLoop):
            records += await _closed(client, jobs, arrival.concurrency, deadline, False)
        else:
            assert offsets is not None
            records += await _open(client, jobs, offsets, arrival.max_concurrency, started_at, deadline)
        ended_at = perf_counter()
    records.sort(key=lambda record: record.sent_at)
    return records, started_at, ended_at


def split_warmup(requests: Iterable[RequestSpec], arrival: Arrival, warmup: int) -> tuple[list[Job], list[Job], list[float] | None]:
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
    *,
    warmup: int = 0,
    duration_s: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    continuous_usage: bool = True,
    progress: Progress | None = None,
) -> LoadResult:
    """Send ``requests`` to ``endpoints`` (base URLs, request ``i`` to ``endpoints[i % n]``).

    The first ``warmup`` requests go first as a closed loop and are marked ``warmup``;
    the measured phase starts when they have all finished and sends the rest by
    ``arrival``, until the workload or ``duration_s`` is exhausted (requests in flight
    then finish and count). ``timeout_s`` bounds each request; ``progress`` is called
    with each finished record.
    """
    warmup_jobs, jobs, offsets = split_warmup(requests, arrival, warmup)
    records, started_at, ended_at = await run_jobs(
        endpoints,
        model,
        warmup_jobs,
        jobs,
        arrival,
        offsets,
        duration_s=duration_s,
        timeout_s=timeout_s,
        continuous_usage=continuous_usage,
        progress=progress,
    )
    cpus = (tuple(sorted(os.sched_getaffinity(0))),)
    return LoadResult(tuple(records), started_at, ended_at, arrival, warmup, duration_s, cpus)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (vLLM depends on it), else asyncio's own loop.

    uvloop costs the client about 40% less CPU per streamed chunk, which is what decides
    how many streams one client process times accurately.
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
    *,
    warmup: int = 0,
    duration_s: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    continuous_usage: bool = True,
    progress: Progress | None = None,
) -> LoadResult:
    """:func:`run_load` on a fresh event loop (see :func:`new_event_loop`), for callers without one."""
    load = run_load(
        endpoints,
        model,
        requests,
        arrival,
        warmup=warmup,
        duration_s=duration_s,
        timeout_s=timeout_s,
        continuous_usage=continuous_usage,
        progress=progress,
    )
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(load)
