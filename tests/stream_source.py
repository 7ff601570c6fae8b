"""A stand-in for vLLM's streaming endpoints that emits tokens at scheduled times.

The client tests need a server whose timing is known exactly, which real vLLM cannot
give. Each request says what it wants in an extra body key, ``x_schedule`` (a dict):

- ``ttft_ms``: delay from receiving the request to the first token chunk (default 0).
- ``itl_ms``: gap before each later chunk: one number, or one per chunk (index 0 unused).
- ``tokens_per_chunk``: tokens carried by each chunk (default one per ``max_tokens``);
  several per chunk imitate speculative decoding / ``--stream-interval``.
- ``empty_text``: indices of chunks whose text is empty (partial byte-level tokens).
- ``text``: the text of every chunk (default ``"tok"``; any string, it is JSON-escaped).
- ``abort_after``: close the connection abruptly after that many chunks.
- ``usage``: false to send no usage at all (default true).
- ``fast``: send every chunk at once, as fast as possible (CPU-cost benchmark).
- ``error``: ``{"status": 4xx, "body": <any JSON>}`` answers with that instead of a stream.

The body is otherwise read like vLLM reads it: ``model`` must match the served name
(else vLLM's 404), ``stream_options.continuous_usage_stats`` adds cumulative usage to
every chunk, and chunks have vLLM's exact JSON layout for completions and chat.

Timing: sends are due at absolute times from when the handler started. The event loop
waits in ``select()``, whose timeout has microsecond resolution, not in epoll, which
rounds up to the next millisecond: late sends would be a fidelity error of the *source*,
not of the client under test (``select`` limits the source to ~1000 connections). Run
it in its own process (:func:`stream_source`), pinned to its own CPU if need be;
``/stats`` reports how late the source actually was.

``GET /stats`` returns request counts per port, the active and peak number of open
streams and the source's send lateness; ``POST /stats/reset`` zeroes them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

MODEL = "stand-in-model"
_json = functools.lru_cache(maxsize=64)(json.dumps)
_STATS = web.AppKey("stats", dict)


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


def _prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return len(prompt)
    if "messages" in body:
        prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
    return max(1, len(str(prompt).split()))


def _frame(event: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk, the way vLLM (uvicorn) sends each event."""
    return b"%x\r\n%s\r\n" % (len(event), event)


async def _stream(request: web.Request) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    started = loop.time()
    body = await request.json()
    stats = request.app[_STATS]
    if body.get("model") != stats["model"]:
        message = f"The model `{body.get('model')}` does not exist."
        error = {"message": message, "type": "NotFoundError", "param": "model", "code": 404}
        return web.json_response({"error": error}, status=404)
    sched: dict[str, Any] = body.get("x_schedule", {})
    if "error" in sched:
        return web.json_response(sched["error"]["body"], status=sched["error"]["status"])

    per_chunk: list[int] = sched.get("tokens_per_chunk") or [1] * int(body["max_tokens"])
    abort_after: int | None = sched.get("abort_after")
    with_usage = sched.get("usage", True)
    continuous = with_usage and bool(body.get("stream_options", {}).get("continuous_usage_stats"))
    fmt = _Format(request.path.endswith("/chat/completions"), body["model"], _prompt_tokens(body), continuous)
    empty, text = set(sched.get("empty_text", ())), sched.get("text", "tok")
    events, completion = [], 0
    for k, tokens in enumerate(per_chunk[:abort_after]):
        completion += tokens
        finish = "length" if k == len(per_chunk) - 1 else None
        events.append(_frame(fmt.chunk("" if k in empty else text * tokens, completion, finish)))
    end = b"" if abort_after is not None else _frame(fmt.final(completion)) * with_usage + _frame(b"data: [DONE]\n\n")

    stats["by_port"][request.transport.get_extra_info("sockname")[1]] += 1
    stats["active"] += 1
    stats["peak_active"] = max(stats["peak_active"], stats["active"])
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    writer = resp._payload_writer  # type: ignore[union-attr]  # we send our own HTTP chunks; aiohttp ends them
    writer.send_headers()
    if fmt.chat:
        request.transport.write(_frame(fmt.role()))
    try:
        if sched.get("fast"):
            await _fast(request.transport, writer, events, end)
        else:
            itl = sched.get("itl_ms", 0.0)
            gaps = itl if isinstance(itl, list) else [itl] * len(per_chunk)
            due = [started + sched.get("ttft_ms", 0.0) / 1e3]
            for gap in gaps[1 : len(events)]:
                due.append(due[-1] + gap / 1e3)
            sent = [started]
            stats["sent"][sched.get("id", len(stats["sent"]))] = (due, sent)
            await _scheduled(request.transport, events, end, due, sent)
    finally:
        stats["active"] -= 1
    if abort_after is not None:
        request.transport.abort()
    else:
        await resp.write_eof()
    return resp


class _Sender:
    """Writes a stream's events at their due times, one timer at a time so that order is kept
    even for equal times; a timer callback per event, no task wake-ups."""

    def __init__(self, transport: asyncio.BaseTransport, events: list[bytes], due: list[float], sent: list[float]) -> None:
        self.transport, self.events, self.due, self.sent = transport, events, due, sent
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self.timer = self.loop.call_at(due[0], self)

    def __call__(self) -> None:
        self.sent.append(self.loop.time())
        k = len(self.sent) - 2  # sent[0] is when the handler started
        if not self.transport.is_closing():
            self.transport.write(self.events[k])  # type: ignore[attr-defined]
        if k + 1 < len(self.events):
            self.timer = self.loop.call_at(self.due[k + 1], self)
        else:
            self.done.set_result(None)


async def _scheduled(transport: asyncio.BaseTransport, events: list[bytes], end: bytes, due: list[float], sent: list[float]) -> None:
    """Send each event at its due time; the end of the stream (final usage, ``[DONE]``) goes
    with the last event, as vLLM sends it right after the last token."""
    events = [*events[:-1], events[-1] + end] if events else [end]
    sender = _Sender(transport, events, due, sent)
    try:
        await sender.done
    finally:
        sender.timer.cancel()


async def _fast(transport: asyncio.Transport, writer: Any, events: list[bytes], end: bytes) -> None:
    """Everything at once in large writes, so that the source outpaces any client."""
    for start in range(0, len(events), 2000):
        transport.write(b"".join(events[start : start + 2000]))
        await writer.drain()
    transport.write(end)


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": request.app[_STATS]["model"], "object": "model"}]})


async def _stats(request: web.Request) -> web.Response:
    stats = request.app[_STATS]
    late = sorted(at - due for dues, sent in stats["sent"].values() for due, at in zip(dues, sent[1:]))
    report = {
        "by_port": {str(port): n for port, n in stats["by_port"].items()},
        "requests": sum(stats["by_port"].values()),
        "active": stats["active"],
        "peak_active": stats["peak_active"],
        "late_ms_p99": late[int(0.99 * (len(late) - 1))] * 1e3 if late else 0.0,
        "late_ms_max": late[-1] * 1e3 if late else 0.0,
    }
    return web.json_response(report)


async def _sent(request: web.Request) -> web.Response:
    return web.json_response({str(key): sent for key, (_, sent) in request.app[_STATS]["sent"].items()})


async def _reset(request: web.Request) -> web.Response:
    stats = request.app[_STATS]
    stats.update(by_port=Counter(), peak_active=stats["active"], sent={})
    return web.Response()


async def serve(n_ports: int, model: str) -> None:
    """Serve on ``n_ports`` free loopback ports, print them as one JSON line, run until SIGTERM."""
    app = web.Application()
    app[_STATS] = {"model": model, "by_port": Counter(), "active": 0, "peak_active": 0, "sent": {}}
    app.add_routes(
        [
            web.post("/v1/completions", _stream),
            web.post("/v1/chat/completions", _stream),
            web.get("/health", _health),
            web.get("/v1/models", _models),
            web.get("/stats", _stats),
            web.get("/sent", _sent),
            web.post("/stats/reset", _reset),
        ]
    )
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    ports = []
    for _ in range(n_ports):
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"ports": ports}), flush=True)
    await stop.wait()
    await runner.cleanup()


@dataclass(frozen=True)
class StreamSource:
    """A running source process and its ports."""

    proc: subprocess.Popen[bytes]
    ports: tuple[int, ...]

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(f"http://127.0.0.1:{port}" for port in self.ports)

    def _call(self, path: str, method: str = "GET") -> bytes:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(urllib.request.Request(self.urls[0] + path, method=method), timeout=10) as resp:
            return resp.read()

    def stats(self) -> dict[str, Any]:
        return json.loads(self._call("/stats"))

    def sent(self) -> dict[int, list[float]]:
        """Per request ``id``: when its handler started, then when each chunk was actually written."""
        return {int(key): times for key, times in json.loads(self._call("/sent")).items()}

    def reset(self) -> None:
        self._call("/stats/reset", "POST")


@contextmanager
def stream_source(n_ports: int = 1, cpus: set[int] | None = None, model: str = MODEL) -> Iterator[StreamSource]:
    """Run the source in its own process (pinned to ``cpus`` if given) for the duration."""
    cmd = [sys.executable, __file__, "--ports", str(n_ports), "--model", model]
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
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())) as runner:
        runner.run(serve(args.ports, args.model))


if __name__ == "__main__":
    main()
