"""The nginx router: a real nginx in front of real upstream processes (the stream source)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import psutil
import pytest

from pytest_qwenperf.serving import process, proctree
from pytest_qwenperf.serving.process import PortInUseError, ServerBootError, ServerError
from pytest_qwenperf.serving.router import (
    NGINX_ENV,
    NO_UPSTREAM,
    NginxRouter,
    RouterUnavailable,
    render_nginx_config,
)
from tests.processes import alive
from tests.stream_source import MODEL, StreamSource, stream_source


@pytest.fixture
def source() -> Iterator[StreamSource]:
    """Two upstreams: one stream-source process listening on two ports, counting requests per port."""
    with stream_source(n_ports=2) as src:
        yield src


@pytest.fixture
def router(nginx: str, source: StreamSource, tmp_path: Path) -> Iterator[NginxRouter]:
    with NginxRouter(source.urls, tmp_path, nginx=nginx) as started:
        yield started


def _request(max_tokens: int, schedule: dict[str, Any]) -> bytes:
    """A streamed completion on a connection that closes after it: reading to EOF means nginx has logged it.

    It accepts gzip, as aiohttp and httpx do by default.
    """
    body = json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": True, "x_schedule": schedule}
    ).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return head.encode() + b"Accept-Encoding: gzip, deflate\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _fetch(router: NginxRouter, request: bytes) -> bytes:
    with socket.create_connection((router.host, router.port), timeout=30) as sock:
        sock.sendall(request)
        return _read_to_end(sock)


def _read_first_chunk(sock: socket.socket) -> bytes:
    """Read until body bytes follow the headers (which may come on their own), whatever their encoding."""
    received = b""
    while not received.partition(b"\r\n\r\n")[2]:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the first chunk: {received!r}"
        received += chunk
    return received


def _read_to_end(sock: socket.socket) -> bytes:
    return b"".join(iter(lambda: sock.recv(65536), b""))


async def _fetch_async(router: NginxRouter, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(router.host, router.port)
    writer.write(request)
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    return response


def _complete(response: bytes) -> bool:
    return response.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in response


def _counted_once_logged(router: NginxRouter, requests: int) -> dict[str, int]:
    """``requests_per_upstream("/v1/")`` once nginx has logged all ``requests`` of the test.

    nginx logs a request when it is done with its connection, which can be a moment after
    the client read the whole response and closed (it drains what the client might still
    send first): read at once, the last request was missing about once in 15 runs here.
    """
    deadline = time.monotonic() + 30
    while (logged := (router.prefix / "access.log").read_text().count("\t/v1/")) < requests:
        assert time.monotonic() < deadline, f"nginx logged {logged} of {requests} requests"
        time.sleep(0.01)
    return router.requests_per_upstream("/v1/")


def _nginx_processes(prefix: Path) -> list[psutil.Process]:
    """Live processes started with ``-p prefix`` (nginx's master, the shell around it) and their children."""
    found = []
    for proc in psutil.process_iter():
        try:
            if f" -p {prefix} " in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found += [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


# ------------------------------------------------------------------------- config


def test_rendered_config_passes_nginx_own_check(nginx: str, tmp_path: Path) -> None:
    upstreams = ["http://127.0.0.1:8123", "http://127.0.0.1:8124/"]
    conf = render_nginx_config(upstreams, listen_host="127.0.0.1", listen_port=8125, prefix=tmp_path)
    (tmp_path / "nginx.conf").write_text(conf)
    check = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr
    upstream_block = conf.split("upstream replicas {")[1].split("}")[0]
    assert "least_conn;" in upstream_block
    assert "server 127.0.0.1:8123;" in upstream_block and "server 127.0.0.1:8124;" in upstream_block


@pytest.mark.parametrize(
    "bad", ["https://127.0.0.1:8000", "http://127.0.0.1", "127.0.0.1:8000", "http://127.0.0.1:8000/v1", "http://h:99999"]
)
def test_upstream_that_is_not_http_host_port_is_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        render_nginx_config(["http://127.0.0.1:8000", bad], listen_host="127.0.0.1", listen_port=1, prefix=tmp_path)


def test_config_nginx_rejects_raises_nginx_message_and_starts_nothing(nginx: str, tmp_path: Path) -> None:
    router = NginxRouter(["http://127.0.0.1:0"], tmp_path, nginx=nginx)  # port 0: nginx's check, not ours, refuses it
    with pytest.raises(ServerError, match=r'invalid port in upstream "127\.0\.0\.1:0"'):
        router.start()
    assert router.tag == "", "nginx must not be started after a failed check"
    assert _nginx_processes(router.prefix) == []


# ---------------------------------------------------------------------- streaming


def test_stream_is_not_buffered(router: NginxRouter, source: StreamSource) -> None:
    """The first chunk must reach the client before the source even sends the second, 1.5 s later.

    Guards against anything in nginx that holds tokens back: e.g. gzip on a buffered proxy
    (without ``proxy_buffering off`` nginx does not flush each read through its filters)
    delivers the whole stream at its end.
    """
    with socket.create_connection((router.host, router.port), timeout=30) as sock:
        sock.sendall(_request(2, {"id": 7, "ttft_ms": 0, "itl_ms": [0, 1500]}))
        received = _read_first_chunk(sock)
        first_at = perf_counter()
        received += _read_to_end(sock)
    _arrived, first_sent, second_sent = source.sent()[7]  # the source's perf_counter: the same clock
    assert first_at < second_sent, f"first chunk reached the client {first_at - second_sent:.3f} s after the second was sent"
    assert first_at - first_sent < 1.0, "the first chunk waited in nginx"
    assert _complete(received)


# ---------------------------------------------------------------------- balancing


def test_concurrent_requests_are_spread_and_counted_exactly(router: NginxRouter, source: StreamSource) -> None:
    async def burst() -> list[bytes]:
        request = _request(2, {"ttft_ms": 500})  # all 40 are in flight together
        return await asyncio.gather(*(_fetch_async(router, request) for _ in range(40)))

    assert all(_complete(r) for r in asyncio.run(burst()))
    by_port = source.stats()["by_port"]
    counted = _counted_once_logged(router, 40)
    assert counted == {url: by_port.get(str(port), 0) for url, port in zip(source.urls, source.ports, strict=True)}
    assert sum(counted.values()) == 40
    assert all(n > 0 for n in counted.values()), counted


def test_least_conn_avoids_the_busy_replica(router: NginxRouter, source: StreamSource) -> None:
    """While one replica holds a long stream, every short request goes to the other (round-robin would alternate)."""
    with socket.create_connection((router.host, router.port), timeout=30) as long_stream:
        long_stream.sendall(_request(2, {"ttft_ms": 0, "itl_ms": [0, 3000]}))
        received = _read_first_chunk(long_stream)
        busy = next(port for port, n in source.stats()["by_port"].items() if n == 1)
        for _ in range(6):
            assert _complete(_fetch(router, _request(1, {})))
        assert _complete(received + _read_to_end(long_stream))
    by_port = source.stats()["by_port"]
    idle = next(str(port) for port in source.ports if str(port) != busy)
    assert (by_port.get(busy), by_port.get(idle)) == (1, 6)


def test_requests_no_upstream_took_are_counted_apart(router: NginxRouter, source: StreamSource) -> None:
    source.proc.terminate()
    source.proc.wait(timeout=10)
    responses = [_fetch(router, _request(1, {})) for _ in range(3)]
    assert all(r.startswith(b"HTTP/1.1 502") for r in responses)
    counted = _counted_once_logged(router, 3)
    # The first request tries both replicas (connection refused) and nginx marks them down;
    # later ones find no replica, or (on a slow machine, once nginx gives the replicas another
    # chance) try one again: each attempt is counted once, under its replica or under NO_UPSTREAM.
    assert set(counted) == {*source.urls, NO_UPSTREAM}, counted
    assert all(counted[url] >= 1 for url in source.urls) and sum(counted.values()) >= 4, counted


# ---------------------------------------------------------------------- lifecycle


def test_stop_leaves_no_process_and_is_idempotent(nginx: str, source: StreamSource, tmp_path: Path) -> None:
    router = NginxRouter(source.urls, tmp_path, nginx=nginx)
    router.start()
    tree = proctree.tagged_processes(router.tag)
    assert len(tree) >= 3, "the tag must find the shell, nginx's master and its worker"
    assert {p.uids().effective for p in tree} == {os.geteuid()}, "workers run as we do (as root: not as nobody)"
    assert {p.pid for p in _nginx_processes(router.prefix)} <= {p.pid for p in tree}
    router.stop()
    router.stop()
    assert [p.pid for p in tree if alive(p)] == []
    assert proctree.tagged_processes(router.tag) == []
    assert _nginx_processes(router.prefix) == []


def test_failed_start_raises_with_error_log_and_leaves_no_process(nginx: str, tmp_path: Path) -> None:
    """nginx must be answering (502) before the timeout: 0.35-0.4 s after the start with four busy
    loops on a 2-core machine, so the timeout is 12 times that."""
    dead = f"http://127.0.0.1:{process.free_port()}"  # nothing listens: /health through nginx is 502
    router = NginxRouter([dead], tmp_path, nginx=nginx, ready_timeout_s=5)
    with pytest.raises(ServerBootError, match=r"(?s)not ready after 5 s.*/health returned 502.*Connection refused"):
        router.start()
    assert router.tag
    assert proctree.tagged_processes(router.tag) == []
    assert _nginx_processes(router.prefix) == []


def test_taken_port_is_retried_in_a_new_folder(
    nginx: str, source: StreamSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], process.free_port()])
        monkeypatch.setattr(process, "free_port", lambda host: next(ports))
        with NginxRouter(source.urls, tmp_path, nginx=nginx) as router:
            assert router.port != taken.getsockname()[1]
            assert router.prefix == tmp_path / "router-nginx-2"
            assert "Address already in use" in (tmp_path / "router-nginx" / "error.log").read_text()


def test_fixed_taken_port_is_not_retried(nginx: str, source: StreamSource, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        router = NginxRouter(source.urls, tmp_path, nginx=nginx, port=taken.getsockname()[1])
        with pytest.raises(PortInUseError):
            router.start()
    assert [p.name for p in tmp_path.iterdir()] == ["router-nginx"]


# -------------------------------------------------------------------- no nginx


def test_missing_nginx_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NGINX_ENV, str(tmp_path / "no-nginx"))
    with pytest.raises(RouterUnavailable, match=rf"\${NGINX_ENV}=.*no-nginx.*apt-get install nginx-light"):
        NginxRouter(["http://127.0.0.1:8000"], tmp_path).start()
    assert list(tmp_path.iterdir()) == [], "nothing is written before nginx is found"
