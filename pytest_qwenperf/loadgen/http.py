"""The client's own HTTP/1.1: a keep-alive connection read through the event loop, each body byte
stamped with when the kernel received it, and the endpoints that hold idle connections
(:mod:`~pytest_qwenperf.loadgen.client` says why not aiohttp)."""

from __future__ import annotations

import asyncio
import contextlib
from time import perf_counter
from urllib.parse import urlsplit

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.loadgen.sse import StreamParser
from pytest_qwenperf.loadgen.stamped_socket import StampedConnection


class Connection:
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
        self.completed_at: float | None = None  # when the kernel received the response's last bytes
        self._parser: StreamParser | None = None
        self._done: asyncio.Future[bool] | None = None  # result: whether the connection can be reused
        self._buffer = b""
        self._framing = ""  # "chunked", "length" or "close" once the headers are in
        self._left = 0  # body bytes left: of the current chunk plus its CRLF, or of the content length
        self._keep_alive = True

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        conn = cls()
        conn.transport = await StampedConnection.open(host, port, conn)
        return conn

    @property
    def closed(self) -> bool:
        return self.transport is None or self.transport.closed

    def request(self, data: bytes, parser: StreamParser) -> asyncio.Future[bool]:
        """Write a request; the future completes when its response has been read in full."""
        assert self.transport is not None and self._done is None
        self.status, self.error_body, self._parser, self.completed_at = None, bytearray(), parser, None
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
            self.completed_at = now
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

    def cut(self) -> None:
        """Abandon the request in flight: close the connection, which the server takes as an abort,
        and fail the response (the transport's ``abort`` tells nobody)."""
        self._finish(ConnectionError("cut before the response was complete"))

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
            self.completed_at = perf_counter()
            self._finish(None)
        else:
            reason = f" ({type(exc).__name__}: {exc})" if exc else ""
            self._finish(ConnectionError(f"connection closed before the response was complete{reason}"))


class Endpoint:
    """A base URL (``http://host:port[/prefix]``), its idle keep-alive connections and how many
    of this client's requests to it are in flight."""

    def __init__(self, url: str, api_key: ApiKey | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"endpoint must be an http:// URL, got {url!r}")
        self.url, self.host, self.port = url, parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.auth = api_key.header_line() if api_key else ""
        self.idle: list[Connection] = []
        self.in_flight = 0
        self.opening: set[asyncio.Task[None]] = set()  # connections being opened ahead of their requests

    def head(self, path: str, length: int) -> bytes:
        return (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUser-Agent: pytest-qwenperf\r\n"
            f"{self.auth}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        ).encode()

    def idle_connection(self) -> Connection | None:
        """An idle connection that is still open, taken; None where there is none."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    async def connection(self) -> Connection:
        return self.idle_connection() or await Connection.open(self.host, self.port)

    def open_ahead(self, count: int) -> None:
        """Open connections in the background until ``count`` are idle or being opened; one that
        cannot be opened is left to the request that needs it, which then connects and fails itself."""
        for _ in range(count - len(self.idle) - len(self.opening)):
            task = asyncio.get_running_loop().create_task(self._open_one())
            self.opening.add(task)
            task.add_done_callback(self.opening.discard)

    async def _open_one(self) -> None:
        with contextlib.suppress(OSError):
            self.idle.append(await Connection.open(self.host, self.port))

    def close(self) -> None:
        for task in self.opening:
            task.cancel()
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.abort()
        self.idle.clear()
