"""A stand-in for vLLM's streaming endpoints that emits tokens at scheduled times.

The client tests need a server whose timing is known exactly, which real vLLM cannot
give. Each request says what it wants in an extra body key, ``x_schedule`` (a dict):

- ``id``: a key under which the actual send times are logged (see ``/sent``).
- ``ttft_ms``: delay from receiving the request to the first token chunk (default 0).
- ``itl_ms``: gap before each later chunk: one number, or one per chunk (index 0 unused).
- ``tokens_per_chunk``: tokens carried by each chunk (default one per ``max_tokens``);
  several per chunk imitate speculative decoding / ``--stream-interval``.
- ``empty_text``: indices of chunks whose text is empty (partial byte-level tokens).
- ``text``: the text of every token (default ``"tok"``; any string, it is JSON-escaped).
- ``abort_after``: reset the connection when that chunk would be due, instead of sending it.
- ``error_after``: send vLLM's in-stream error event (then ``[DONE]``) there instead.
- ``usage``: false to send no usage at all (default true).
- ``fast``: send every chunk at once, as fast as possible (CPU-cost benchmark).
- ``hold_until``: n: the stream's schedule starts only once n streams asking this are open
  at once (the n-th starts them all): a client that cannot open n at once never gets a token.
- ``error``: ``{"status": 4xx, "body": <any JSON>}`` answers with that instead of a stream.

Started in sleep mode (``serve(sleep_mode=True)``: vLLM's ``--enable-sleep-mode`` in dev mode),
it serves ``POST /sleep?level=N``, ``POST /wake_up`` and ``GET /is_sleeping`` as vLLM does, and
answers a request sent while asleep with 503, so a request to a sleeping server cannot pass
unseen; without it those routes are vLLM's 404.

Requests without ``x_schedule`` (from clients that cannot add body keys) get the one
given with ``--schedule`` (default: none, so one token per ``max_tokens``, at once).

The body is otherwise read like vLLM reads it: ``model`` must match the served name
(else vLLM's 404), ``stream_options.continuous_usage_stats`` adds cumulative usage to
every chunk, chunks have vLLM's exact JSON layout for completions and chat, and each
SSE event is its own HTTP chunk, as uvicorn sends them.

It is written on asyncio protocols, not aiohttp.web: on a 2-vCPU VM an aiohttp.web
request cost ~270 us of CPU and ~45 us per chunk, and a closed loop's burst of 256
requests queued for 70 ms in the *source*. Here it is ~170 us per one-token request and
~35 us per chunk, most of it the kernel's; a request's arrival is stamped in
``data_received`` and chunks are written from timer callbacks. The loop sleeps in epoll,
which wakes on a millisecond clock, so a chunk may leave up to ~1 ms after its due time
(``select()`` would be exact but costs the source twice the CPU with hundreds of
connections, and CPU is what makes a small VM stall): the source logs when it actually
sent each chunk (just before and just after each write) and the tests compare the client
against that. Run it in its own process (:func:`stream_source`), pinned to its own CPU if
need be. Connections carry one request at a time (no pipelining), as HTTP clients use them.

``GET /stats`` returns request counts per port, the active and peak number of open
streams and how late the source was against the schedules; ``GET /sent`` the send log;
``GET /written`` when each chunk's write had returned; ``POST /stats/reset`` clears them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any

MODEL = "stand-in-model"
_json = functools.lru_cache(maxsize=64)(json.dumps)


def _usage(prompt: int, completion: int) -> str:
    return f'"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},"completion_tokens":{completion}}}'


class _Format:
    """vLLM's chunk layout (``model_dump_json(exclude_unset=True)``) for one request."""

    def __init__(self, chat: bool, model: str, prompt_tokens: int, continuous: bool) -> None:
        kind = '"chatcmpl-0","object":"chat.completion.chunk"' if chat else '"cmpl-0","object":"text_completion"'
        self.head = f'data: {{"id":{kind},"created":{int(time.time())},"model":{json.dumps(model)},"choices":['
        self.chat, self.prompt_tokens, self.continuous = chat, prompt_tokens, continuous

    def chunk(self, text: str, completion: int, finish: str | None = None) -> bytes:
        text, reason = _json(text), _json(finish)
        if self.chat:
            choice = f'{{"index":0,"delta":{{"content":{text}}},"logprobs":null,"finish_reason":{reason}}}'
        else:
            choice = f'{{"index":0,"text":{text},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}'
        usage = "," + _usage(self.prompt_tokens, completion) if self.continuous else ""
        return f"{self.head}{choice}]{usage}}}\n\n".encode()

    def role(self) -> bytes:
        """Chat's first chunk: the role, no tokens (usage 0 when continuous)."""
        usage = "," + _usage(self.prompt_tokens, 0) if self.continuous else ""
        choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
        return f"{self.head}{choice}]{usage}}}\n\n".encode()

    def final(self, completion: int) -> bytes:
        return f"{self.head}],{_usage(self.prompt_tokens, completion)}}}\n\n".encode()


def _frame(event: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(event), event)


_END = _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
_ERROR = {"error": {"message": "stand-in failure mid-stream", "type": "InternalServerError", "param": None, "code": 500}}
_ERROR_EVENT = _frame(b"data: %s\n\n" % json.dumps(_ERROR).encode())  # json.dumps, as vLLM writes it
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 422: "Unprocessable Entity"}


def _response(status: int, body: Any = None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n%s" % (len(data), data)


def _prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return len(prompt)
    if "messages" in body:
        prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
    return max(1, len(str(prompt).split()))


class _Source:
    """What all connections share: the served model, counters and the send log."""

    def __init__(
        self, model: str, default_schedule: dict[str, Any], answers: dict[str, bytes] | None = None, sleep_mode: bool = False
    ) -> None:
        self.model = model
        self.sleep_mode = sleep_mode
        self.asleep = False
        self.default_schedule = default_schedule  # for requests without ``x_schedule`` (other clients)
        self.answers = answers or {}  # GET path -> the body of a 200 answer (e.g. garbage for /version, /metrics)
        self.by_port: Counter[int] = Counter()
        self.active = self.peak_active = 0
        self.held: list[_Stream] = []  # streams waiting for ``hold_until`` others
        # id -> (due times, [arrived, chunk sends...], [after each chunk's write: None if it had to wait for the socket])
        self.sent: dict[Any, tuple[list[float], list[float], list[float | None]]] = {}

    def stats(self) -> dict[str, Any]:
        late = sorted(at - due for dues, sent, _ in self.sent.values() for due, at in zip(dues, sent[1:], strict=False))
        return {
            "by_port": {str(port): n for port, n in self.by_port.items()},
            "requests": sum(self.by_port.values()),
            "active": self.active,
            "peak_active": self.peak_active,
            "late_ms_p99": late[int(0.99 * (len(late) - 1))] * 1e3 if late else 0.0,
            "late_ms_max": late[-1] * 1e3 if late else 0.0,
        }


class _Stream:
    """One streamed response: sends its chunks at their due times from a chain of timers."""

    def __init__(
        self,
        conn: _Connection,
        fmt: _Format,
        per_chunk: list[int],
        texts: list[str],
        due: list[float],
        sent: list[float],
        written: list[float | None],
        held: bool = False,
    ) -> None:
        """``texts`` shorter than ``per_chunk``: the stream is cut (``conn.cut``) where the next chunk is due.
        ``held``: the schedule starts at :meth:`release`, not at the request's arrival."""
        self.conn, self.fmt, self.per_chunk, self.texts, self.due, self.sent = conn, fmt, per_chunk, texts, due, sent
        self.written = written
        self.completion = 0
        self.loop = asyncio.get_running_loop()
        self.timer = None if held else self._at(due[0])

    def release(self) -> None:
        """Start a held stream's schedule now (unless its connection is gone meanwhile)."""
        if self.conn.stream is self:
            shift = perf_counter() - self.sent[0]
            self.due[:] = [due + shift for due in self.due]
            self.timer = self._at(self.due[0])

    def _at(self, due: float) -> asyncio.TimerHandle:
        return self.loop.call_later(due - perf_counter(), self._send)

    def _send(self) -> None:
        k = len(self.sent) - 1  # sent[0] is the arrival
        transport = self.conn.transport
        if k == len(self.texts):
            self.sent.append(perf_counter())
            if self.conn.cut == "error_after":
                transport.write(_ERROR_EVENT + _END)
                self.conn.end_stream()
            else:
                transport.abort()
            return
        self.completion += self.per_chunk[k]
        last = k == len(self.per_chunk) - 1
        data = _frame(self.fmt.chunk(self.texts[k], self.completion, "length" if last else None))
        if last:
            data += (_frame(self.fmt.final(self.completion)) if self.conn.with_usage else b"") + _END
        self.sent.append(perf_counter())
        transport.write(data)
        # The kernel took the bytes (and stamped their arrival on loopback) within the write, unless it had to wait.
        self.written.append(None if transport.get_write_buffer_size() else perf_counter())
        if last:
            self.conn.end_stream()
        else:
            self.timer = self._at(self.due[k + 1])

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class _Connection(asyncio.Protocol):
    """One client connection: parses requests (``Content-Length`` bodies) and answers them."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.transport: asyncio.Transport  # set in connection_made
        self.buffer = b""
        self.arrived = 0.0
        self.stream: _Stream | asyncio.Task[None] | None = None
        self.with_usage = True
        self.cut = ""  # "abort_after" or "error_after": how the current stream ends early
        self._writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a TCP server's
        self.transport = transport
        self.port = transport.get_extra_info("sockname")[1]

    def data_received(self, data: bytes) -> None:
        if not self.buffer:
            self.arrived = perf_counter()  # the request's first bytes: TTFT is scheduled from here
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            lines = self.buffer[:end].split(b"\r\n")
            method, target = lines[0].split(b" ")[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            self._handle(method.decode(), target.decode(), body)
            self.arrived = perf_counter()

    def _handle(self, method: str, path: str, body: bytes) -> None:
        source = self.source
        route = path.split("?", 1)[0]
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            if source.asleep:
                self.transport.write(_response(503, {"error": {"message": "the engine is asleep", "code": 503}}))
            else:
                self._start_stream(path, json.loads(body))
        elif source.sleep_mode and method == "POST" and route in ("/sleep", "/wake_up"):
            source.asleep = route == "/sleep"
            self.transport.write(_response(200, {"status": "sleeping" if source.asleep else "awake"}))
        elif source.sleep_mode and route == "/is_sleeping":
            self.transport.write(_response(200, {"is_sleeping": source.asleep}))
        elif method == "GET" and path in source.answers:
            data = source.answers[path]
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        elif path == "/health":
            self.transport.write(_response(200))
        elif path == "/v1/models":
            self.transport.write(_response(200, {"object": "list", "data": [{"id": source.model, "object": "model"}]}))
        elif path == "/stats":
            self.transport.write(_response(200, source.stats()))
        elif path == "/sent":
            self.transport.write(_response(200, {str(key): sent for key, (_, sent, _) in source.sent.items()}))
        elif path == "/written":
            self.transport.write(_response(200, {str(key): written for key, (_, _, written) in source.sent.items()}))
        elif method == "POST" and path == "/stats/reset":
            source.by_port.clear()
            source.sent.clear()
            source.peak_active = source.active
            self.transport.write(_response(200))
        else:
            self.transport.write(_response(404, {"detail": "Not Found"}))

    def _start_stream(self, path: str, body: dict[str, Any]) -> None:
        source = self.source
        if body.get("model") != source.model:
            message = f"The model `{body.get('model')}` does not exist."  # vLLM's answer
            error = {"message": message, "type": "NotFoundError", "param": "model", "code": 404}
            self.transport.write(_response(404, {"error": error}))
            return
        sched: dict[str, Any] = body.get("x_schedule", source.default_schedule)
        if "error" in sched:
            self.transport.write(_response(sched["error"]["status"], sched["error"]["body"]))
            return
        per_chunk: list[int] = sched.get("tokens_per_chunk") or [1] * int(body["max_tokens"])
        self.with_usage = sched.get("usage", True)
        continuous = self.with_usage and bool(body.get("stream_options", {}).get("continuous_usage_stats"))
        fmt = _Format(path.endswith("/chat/completions"), body["model"], _prompt_tokens(body), continuous)
        empty, text = set(sched.get("empty_text", ())), sched.get("text", "tok")
        self.cut = next((key for key in ("abort_after", "error_after") if key in sched), "")
        texts = ["" if k in empty else text * n for k, n in enumerate(per_chunk)]
        if self.cut:
            texts = texts[: sched[self.cut]]
        source.by_port[self.port] += 1
        source.active += 1
        source.peak_active = max(source.peak_active, source.active)
        self.transport.write(_STREAM_HEAD + (_frame(fmt.role()) if fmt.chat else b""))
        if sched.get("fast"):
            self.stream = asyncio.ensure_future(self._fast(fmt, per_chunk, texts))
            return
        itl = sched.get("itl_ms", 0.0)
        gaps = itl if isinstance(itl, list) else [itl] * len(per_chunk)
        due = [self.arrived + sched.get("ttft_ms", 0.0) / 1e3]
        for gap in gaps[1 : len(texts) + 1]:  # one more than sent when aborting: when to cut
            due.append(due[-1] + gap / 1e3)
        sent, written = [self.arrived], []
        source.sent[sched.get("id", len(source.sent))] = (due, sent, written)
        hold = sched.get("hold_until")
        self.stream = _Stream(self, fmt, per_chunk, texts, due, sent, written, held=hold is not None)
        if hold is not None:
            source.held = [stream for stream in source.held if stream.conn.stream is stream]  # still open
            source.held.append(self.stream)
            if len(source.held) >= hold:
                for stream in source.held:
                    stream.release()
                source.held.clear()

    async def _fast(self, fmt: _Format, per_chunk: list[int], texts: list[str]) -> None:
        """Everything at once in large writes, so that the source outpaces any client."""
        events, completion = [], 0
        for n, text in zip(per_chunk, texts, strict=False):  # texts stop where the stream is cut
            completion += n
            events.append(_frame(fmt.chunk(text, completion)))
            if len(events) == 2000:
                self.transport.write(b"".join(events))
                events = []
                if self._writable is not None:
                    await self._writable
        if self.cut == "abort_after":
            self.transport.write(b"".join(events))
            self.transport.abort()
            return
        if self.cut == "error_after":
            end = _ERROR_EVENT + _END
        else:
            end = (_frame(fmt.final(completion)) if self.with_usage else b"") + _END
        self.transport.write(b"".join(events) + end)
        self.end_stream()

    def end_stream(self) -> None:
        if self.stream is not None:
            self.stream = None
            self.source.active -= 1

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            self._writable.set_result(None)
            self._writable = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.cancel()
        self.end_stream()


async def serve(
    n_ports: int,
    model: str,
    default_schedule: dict[str, Any],
    answers: dict[str, bytes] | None = None,
    port: int = 0,
    sleep_mode: bool = False,
) -> None:
    """Serve on ``n_ports`` free loopback ports (one: ``port`` if given), print them as one JSON line, run until SIGTERM."""
    loop = asyncio.get_running_loop()
    source = _Source(model, default_schedule, answers, sleep_mode)
    servers = [await loop.create_server(lambda: _Connection(source), "127.0.0.1", port, backlog=1024) for _ in range(n_ports)]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"ports": [server.sockets[0].getsockname()[1] for server in servers]}), flush=True)
    await stop.wait()
    for server in servers:
        server.close()


@dataclass(frozen=True)
class StreamSource:
    """A running source process and its ports."""

    proc: subprocess.Popen[bytes]
    ports: tuple[int, ...]

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(f"http://127.0.0.1:{port}" for port in self.ports)

    def _call(self, path: str, method: str = "GET") -> bytes:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy from the environment
        request = urllib.request.Request(self.urls[0] + path, data=b"" if method == "POST" else None)
        with opener.open(request, timeout=10) as resp:
            return resp.read()

    def stats(self) -> dict[str, Any]:
        return json.loads(self._call("/stats"))

    def sent(self) -> dict[int, list[float]]:
        """Per request ``id``: when the request arrived, then when each chunk was written (``perf_counter``)."""
        return {int(key): times for key, times in json.loads(self._call("/sent")).items()}

    def written(self) -> dict[int, list[float | None]]:
        """Per request ``id``: when each token chunk's write had returned (``perf_counter``; None: the socket made it wait)."""
        return {int(key): times for key, times in json.loads(self._call("/written")).items()}

    def reset(self) -> None:
        self._call("/stats/reset", "POST")


@contextmanager
def stream_source(
    n_ports: int = 1,
    cpus: set[int] | None = None,
    model: str = MODEL,
    default_schedule: dict[str, Any] | None = None,
    answers: dict[str, bytes] | None = None,
) -> Iterator[StreamSource]:
    """Run the source in its own process (pinned to ``cpus`` if given) for the duration.

    ``answers``: GET paths answered 200 with these bodies instead (a server whose /version or /metrics is garbage)."""
    cmd = [sys.executable, __file__, "--ports", str(n_ports), "--model", model, "--schedule", json.dumps(default_schedule or {})]
    if answers:
        cmd += ["--answers", json.dumps({path: body.hex() for path, body in answers.items()})]
    if cpus:
        cmd += ["--cpus", ",".join(map(str, sorted(cpus)))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"stream source exited with {proc.wait()}")
        yield StreamSource(proc, tuple(json.loads(line)["ports"]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ports", type=int, default=1, help="how many loopback ports to listen on")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--cpus", help="comma-separated CPU ids to pin the source to")
    parser.add_argument("--schedule", type=json.loads, default={}, help="x_schedule for requests that carry none (JSON)")
    parser.add_argument("--answers", type=json.loads, default={}, help="GET path -> hex of the body of a 200 answer (JSON)")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    asyncio.run(serve(args.ports, args.model, args.schedule, {path: bytes.fromhex(body) for path, body in args.answers.items()}))


if __name__ == "__main__":
    main()
