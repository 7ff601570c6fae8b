"""The lifecycle every process tree this package runs goes through: vLLM servers and nginx alike.

A :class:`ManagedProcess` starts its command in a session of its own under the guard
(:func:`~pytest_qwenperf.serving.proctree.spawn_tree`: the tree dies with this process),
picks another free port while the one it tried turns out taken, polls the readiness probe
its :class:`ProcessSpec` gives it, fails at once with the log's tail when the process dies while starting, and
takes the whole tree down on stop. What it runs, how readiness is judged and how an early
exit is told are its owner's (:mod:`~pytest_qwenperf.serving.server`,
:mod:`~pytest_qwenperf.serving.router`).
"""

from __future__ import annotations

import atexit
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

from pytest_qwenperf.core.apikey import shown_command
from pytest_qwenperf.serving import proctree

LOG_TAIL_LINES = 40
PORT_RETRIES = 3
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


# ------------------------------------------------------------------------- ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS had free a moment ago; :func:`start_on_a_port` retries if it is taken meanwhile."""
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


# -------------------------------------------------------------------------- logs


def tail_of(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when there is none yet)."""
    if path is None or not path.exists():
        return ""
    with open(path, errors="replace") as log:
        return "".join(deque(log, maxlen=lines)).rstrip("\n")


def unused_path(log_dir: Path, name: str, suffix: str = "", *, folder: bool = False) -> Path:
    """``log_dir/<name><suffix>``, or ``<name>-2<suffix>`` …, made now (an empty file, or a
    ``folder``): every attempt writes somewhere new, an earlier log is never overwritten."""
    log_dir.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    path, n = log_dir / f"{safe}{suffix}", 2
    while True:
        try:
            if folder:
                path.mkdir()
            else:
                path.touch(exist_ok=False)
            return path
        except FileExistsError:
            path, n = log_dir / f"{safe}-{n}{suffix}", n + 1


# ---------------------------------------------------------------------- lifecycle


class StartStop:
    """Started on entering a ``with`` block and stopped on leaving it, however the block ends."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@dataclass(frozen=True)
class Launch:
    """One attempt at starting: the command, the log its output is appended to, what it adds to
    the environment, the CPUs its whole tree runs on (empty: no pinning), and the environment
    variables that point it at a folder of the tree's own (:func:`scratch_folder`), made when it
    starts and removed with it, by the guard or by :meth:`ManagedProcess.stop`, whichever ends last."""

    argv: tuple[str, ...]
    log_path: Path
    env: Mapping[str, str]
    cpus: frozenset[int] = frozenset()
    scratch_env: tuple[str, ...] = ()


_SOCKET_PATH_MAX = 107
"""The longest path a Unix socket may have (``sockaddr_un.sun_path`` less its terminating zero)."""
_SOCKET_NAME = 36
"""Room left in a tree's folder for a socket's name (vLLM names its IPC sockets by UUID)."""


def scratch_folder() -> Path:
    """A new folder for one tree's own files, sockets among them: in the temporary folder, or in
    ``/tmp`` where the temporary folder's path leaves no room for a socket's name in a folder of its own."""
    where = tempfile.gettempdir()
    if len(where) + len("/qwenperf-12345678/") + _SOCKET_NAME > _SOCKET_PATH_MAX:
        where = "/tmp"
    return Path(tempfile.mkdtemp(prefix="qwenperf-", dir=where))


Probe = Callable[[], str | None]
"""None once the process is ready, else why not (a timeout names the last reason); it may raise
to stop waiting at once."""


@dataclass(frozen=True)
class ProcessSpec:
    """What a :class:`ManagedProcess` is told before it starts: how messages call it (``name``:
    ``server 'vllm'``), the readiness ``probe``, ``exited(code, after_s)``: the headline of the error
    when it exits while starting, where it listens (``port`` None: a free one), how long it may take
    to be ready and how often the probe is polled meanwhile, and how long ``stop`` waits after
    SIGTERM before it kills the tree."""

    name: str
    probe: Probe
    exited: Callable[[int, float], str]
    host: str
    port: int | None
    ready_timeout_s: float
    poll_interval_s: float
    stop_grace_s: float = 15.0


class ManagedProcess:
    """One process tree that this object starts and stops (``stop`` is idempotent), as its
    :class:`ProcessSpec` says."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.port: int | None = None  # of the latest attempt
        self.log_path: Path | None = None  # of the latest attempt
        self.tag = ""  # the proctree.TAG_ENV value of the latest attempt's processes
        self._popen: subprocess.Popen[bytes] | None = None
        self._scratch: Path | None = None  # the latest attempt's own folder (Launch.scratch_env)

    @property
    def pid(self) -> int | None:
        """The tree's root (its guard)."""
        return self._popen.pid if self._popen else None

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The root's exit status once it has exited (negative: killed by that signal)."""
        return self._popen.poll() if self._popen else None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail_of(self.log_path, lines)

    def start(self, launch: Callable[[int], Launch]) -> None:
        """Start ``launch(port)`` and wait until the probe says ready, on the requested port or on free
        ones while they turn out taken; on any failure (or Ctrl-C) nothing is left running."""
        start_on_a_port(lambda port: self._start_once(launch, port), self.spec.host, self.spec.port)

    def stop(self) -> None:
        if self._popen is None:
            return
        try:
            proctree.stop_tree(self._popen, self.tag, grace=self.spec.stop_grace_s)
        finally:
            self._popen = None
            LIVE.discard(self)
            self._remove_scratch()  # the guard's own removal is lost where the stop had to SIGKILL it

    def _remove_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _start_once(self, launch: Callable[[int], Launch], port: int) -> None:
        self.port = port
        attempt = launch(port)
        self.log_path = attempt.log_path
        self.tag = proctree.new_tag()
        self._scratch = scratch_folder() if attempt.scratch_env else None
        env = {**attempt.env, **{name: str(self._scratch) for name in attempt.scratch_env}}
        try:
            self._popen = proctree.spawn_tree(
                attempt.argv, log_path=attempt.log_path, env=env, tag=self.tag, cpus=attempt.cpus, scratch=self._scratch
            )
        except BaseException:
            self._remove_scratch()
            raise
        LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self._popen is not None
        started = time.monotonic()
        while True:
            code = self._popen.poll()
            if code is not None:
                self._raise_exited(code, time.monotonic() - started)
            reason = self.spec.probe()
            if reason is None:
                return
            if time.monotonic() - started > self.spec.ready_timeout_s:
                raise ServerBootError(
                    f"{self.spec.name} not ready after {self.spec.ready_timeout_s:.0f} s (last probe: {reason})",
                    log_path=self.log_path,
                    log_tail=self.log_tail(),
                )
            time.sleep(self.spec.poll_interval_s)

    def _raise_exited(self, code: int, after_s: float) -> None:
        tail = self.log_tail()
        if _PORT_IN_USE in tail:
            raise PortInUseError(f"{self.spec.name} could not bind {self.spec.host}:{self.port}: {_PORT_IN_USE}\n{tail}")
        raise ServerBootError(self.spec.exited(code, after_s), log_path=self.log_path, log_tail=tail)


LIVE: set[ManagedProcess] = set()
"""Started process trees (servers, routers) not yet stopped: each adds itself when it starts
and removes itself in ``stop``. They run in sessions of their own, so nothing else stops them."""


@atexit.register
def _stop_leftovers() -> None:
    """Last line of defence when the interpreter exits with servers still up."""
    for started in list(LIVE):
        started.stop()
