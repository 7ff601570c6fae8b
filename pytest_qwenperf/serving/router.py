"""A real nginx with ``least_conn`` in front of N vLLM replicas.

Why nginx: it is what production puts in front of replicas, and ``least_conn`` sends each
new request to the replica with the fewest requests in flight. Round-robin would queue
requests behind long generations on one replica while another sits idle; a benchmark of
several replicas should measure the balancer it will be deployed with, not an idealised
client-side split.

Why these proxy settings: token streaming (SSE) must reach the client chunk by chunk, or
TTFT and inter-token latency measure nginx instead of vLLM. ``proxy_buffering off`` makes
nginx flush every read from the replica through to the client; buffered, it passes
buffer-sized pieces without flushing, so a filter that accumulates (gzip, for one) holds
the whole stream back, and a slow client makes nginx spool the stream to disk instead of
slowing the replica down. ``proxy_request_buffering off`` sends long prompts on without
spooling them first; HTTP/1.1 with an empty ``Connection`` header keeps connections to
the replicas alive (no new TCP connection per request); the timeouts outlast any generation.

No pytest here, as in :mod:`pytest_qwenperf.serving.server`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from pytest_qwenperf.core.http import http_get
from pytest_qwenperf.serving.process import (
    LOG_TAIL_LINES,
    Launch,
    ManagedProcess,
    ProcessSpec,
    ServerError,
    StartStop,
    tail_of,
    unused_path,
)

NGINX_ENV = "QWENPERF_NGINX"
"""Path of the nginx binary to use instead of the one found on ``PATH``."""

NO_UPSTREAM = "-"
"""Key of :meth:`NginxRouter.requests_per_upstream` for requests that reached no replica."""

_INSTALL_HINT = "install it from the OS packages: apt-get install nginx-light"
_DEBIAN_NGINX = "/usr/sbin/nginx"  # often not on a non-root PATH
_UPSTREAM_GROUP = "replicas"
_LOG_FIELDS = ("msec", "status", "request_method", "request_uri", "upstream_addr", "upstream_status", "request_time")
_POLL_INTERVAL_S = 0.1


class RouterUnavailable(Exception):
    """nginx cannot be used on this machine; the message says why and how to get it."""


def find_nginx() -> str:
    """``$QWENPERF_NGINX``, else ``nginx`` on ``PATH``, else Debian's ``/usr/sbin/nginx``."""
    configured = os.environ.get(NGINX_ENV)
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise RouterUnavailable(f"${NGINX_ENV}={configured} is not an executable file; {_INSTALL_HINT}")
        return configured
    found = shutil.which("nginx") or (_DEBIAN_NGINX if os.access(_DEBIAN_NGINX, os.X_OK) else None)
    if found is None:
        raise RouterUnavailable(f"nginx not found on PATH (or ${NGINX_ENV}); {_INSTALL_HINT}")
    return found


def _host_port(url: str) -> str:
    """``http://host:port`` (a trailing slash allowed) as nginx's ``host:port``; ValueError otherwise."""
    parts = urlsplit(url.rstrip("/"))
    try:
        port = parts.port
    except ValueError:
        port = None
    extra = parts.username or parts.path or parts.query or parts.fragment
    if parts.scheme != "http" or not parts.hostname or port is None or extra:
        raise ValueError(f"upstream {url!r} is not an http://host:port URL")
    return f"{_bracketed(parts.hostname)}:{port}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _quoted(path: Path) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_nginx_config(
    upstreams: Sequence[str],
    *,
    listen_host: str,
    listen_port: int,
    prefix: Path,
    worker_processes: int = 1,
    user: str | None = None,
) -> str:
    """A complete nginx.conf that runs without root: every file and temp folder is in ``prefix``.

    ``user``: the workers' user. nginx started as root switches its workers to ``nobody``,
    who cannot enter a private prefix (pytest's tmp folders are 0700), so pass ``"root"``
    then; without root nginx ignores the directive (with a warning), so leave it None.
    """
    if not upstreams:
        raise ValueError("the router needs at least one upstream")
    servers = "\n".join(f"        server {_host_port(url)};" for url in upstreams)
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp = "\n".join(f"    {kind}_temp_path {_quoted(prefix / f'{kind}_temp')};" for kind in kinds)
    log_format = "\\t".join(f"${field}" for field in _LOG_FIELDS)
    return f"""\
daemon off;
master_process on;
worker_processes {worker_processes};
{f"user {user};" if user else ""}
pid {_quoted(prefix / "nginx.pid")};
error_log {_quoted(prefix / "error.log")};

events {{
    worker_connections 8192;
}}

http {{
{temp}
    log_format qwenperf "{log_format}";
    access_log {_quoted(prefix / "access.log")} qwenperf;

    upstream {_UPSTREAM_GROUP} {{
        zone {_UPSTREAM_GROUP} 64k;  # least_conn counts shared by all workers
        least_conn;
{servers}
        keepalive 128;
    }}

    server {{
        listen {_bracketed(listen_host)}:{listen_port};
        client_max_body_size 64m;  # long prompts

        location / {{
            proxy_pass http://{_UPSTREAM_GROUP};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
    }}
}}
"""


class NginxRouter(StartStop):
    """One nginx in front of ``upstreams`` (replica base URLs) that this object starts and stops.

    Use as a context manager, or call :meth:`start` / :meth:`stop` (``stop`` is idempotent).
    """

    def __init__(
        self,
        upstreams: Sequence[str],
        log_dir: Path,
        *,
        name: str = "router",
        host: str = "127.0.0.1",
        port: int | None = None,
        ready_timeout_s: float = 30.0,
        nginx: str | None = None,
    ) -> None:
        self.upstreams = tuple(url.rstrip("/") for url in upstreams)
        for url in self.upstreams:
            _host_port(url)
        self.log_dir = Path(log_dir)
        self.name = name
        self.host = host
        self.nginx = nginx
        self._prefix: Path | None = None
        self._process = ManagedProcess(
            ProcessSpec(
                f"router {name!r}",
                self._probe,
                lambda code, _after_s: f"router {name!r}: nginx exited with code {code} while starting",
                host=host,
                port=port,
                ready_timeout_s=ready_timeout_s,
                poll_interval_s=_POLL_INTERVAL_S,
            )
        )

    @property
    def port(self) -> int | None:
        """The port nginx listens on: the one asked for until it starts."""
        return self._process.port if self._process.port is not None else self._process.spec.port

    @property
    def ready_timeout_s(self) -> float:
        return self._process.spec.ready_timeout_s

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise ServerError(f"router {self.name!r} is not running")
        return f"http://{_bracketed(self.host)}:{self.port}"

    @property
    def prefix(self) -> Path:
        """nginx's folder: ``nginx.conf``, ``error.log`` (nginx's output too), ``access.log``, temp folders."""
        if self._prefix is None:
            raise ServerError(f"router {self.name!r} was never started")
        return self._prefix

    @property
    def tag(self) -> str:
        """The :data:`~pytest_qwenperf.serving.proctree.TAG_ENV` value of every nginx process."""
        return self._process.tag

    def start(self) -> None:
        """Check the config, start nginx, wait until ``/health`` through it is 200; on failure nothing is left."""
        nginx = self.nginx or find_nginx()
        self._process.start(lambda port: self._launch(nginx, port))

    def stop(self) -> None:
        self._process.stop()

    def requests_per_upstream(self, path: str = "") -> dict[str, int]:
        """Requests nginx sent to each upstream (base URL), from its access log.

        Only requests whose path starts with ``path`` count (e.g. ``/v1/`` leaves out the
        readiness probes). A request nginx tried on several replicas (a connection error
        makes it try the next) counts for each. Requests that reached no replica (nginx
        answered them itself: a malformed request, or every replica down) count under
        :data:`NO_UPSTREAM`, which is present only when there are some. nginx logs a
        request after sending its last byte: read this after the clients' connections
        closed, not as soon as they received the response.
        """
        addresses = {addr: url for url in self.upstreams for addr in _addresses(url)}
        counts: Counter[str] = Counter(dict.fromkeys(self.upstreams, 0))
        with open(self.prefix / "access.log", errors="replace") as log:
            for line in log:
                fields = dict(zip(_LOG_FIELDS, line.rstrip("\n").split("\t"), strict=False))  # a short line leaves fields out
                if not fields.get("request_uri", "").startswith(path):
                    continue
                tried = [addresses[a] for a in re.split(r", | : ", fields["upstream_addr"]) if a in addresses]
                counts.update(tried or [NO_UPSTREAM])
        return dict(counts)

    def error_log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail_of(self.prefix / "error.log", lines)

    def _launch(self, nginx: str, port: int) -> Launch:
        """A new folder with the config for ``port``, checked by ``nginx -t``."""
        self._prefix = prefix = unused_path(self.log_dir, f"{self.name}-nginx", folder=True)
        conf = prefix / "nginx.conf"
        conf.write_text(
            render_nginx_config(
                self.upstreams,
                listen_host=self.host,
                listen_port=port,
                prefix=prefix,
                user="root" if os.geteuid() == 0 else None,
            )
        )
        argv = (nginx, "-p", str(prefix), "-c", str(conf))
        check = subprocess.run([*argv, "-t", "-q"], capture_output=True, text=True, timeout=60, check=False)
        if check.returncode != 0:
            raise ServerError(f"nginx rejected {conf}:\n{(check.stderr + check.stdout).strip()}")
        return Launch(argv, prefix / "error.log", {})

    def _probe(self) -> str | None:
        try:
            status, _ = http_get(f"{self.base_url}/health", timeout=2.0)
        except OSError as exc:  # refused while nginx binds, reset, timeout
            return f"{type(exc).__name__}: {exc}"
        return None if status == 200 else f"/health returned {status}"


def _addresses(url: str) -> set[str]:
    """The ``ip:port`` forms nginx writes to ``$upstream_addr`` for this upstream (it resolves names once, at start)."""
    parts = urlsplit(url)
    infos = socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM)
    return {f"{_bracketed(str(info[4][0]))}:{parts.port}" for info in infos}
