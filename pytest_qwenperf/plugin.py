"""pytest glue: options, ini keys, markers, fixtures and hooks over the library.

Settings follow one path, CLI option → ini key → default, resolved once in
``pytest_configure`` into a frozen :class:`QwenperfSettings` kept in ``config.stash``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from pytest_qwenperf import proctree
from pytest_qwenperf.config import ServingConfig
from pytest_qwenperf.options import endpoint_url, launcher_argv, positive_seconds
from pytest_qwenperf.pool import PoolSettings, ServerPool
from pytest_qwenperf.server import DEFAULT_BOOT_TIMEOUT_S, DEFAULT_LAUNCHER, Server

MARKERS = {
    "cpu": "runs on the CPU build of vLLM (the embedded default)",
    "gpu": "needs NVIDIA GPUs",
    "b200": "sized for one node of 8x NVIDIA B200",
    "h200": "sized for one node of 8x NVIDIA H200",
    "h100": "sized for one node of 8x NVIDIA H100",
    "scaling": "multi-replica scaling-efficiency tests",
}


@dataclass(frozen=True)
class QwenperfSettings:
    launcher: tuple[str, ...]
    boot_timeout_s: float
    log_dir: Path | None
    endpoints: tuple[str, ...]


SETTINGS_KEY = pytest.StashKey[QwenperfSettings]()
_USES_KEY = pytest.StashKey[Counter[str]]()
_T = TypeVar("_T")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("qwenperf", "vLLM performance gates (pytest-qwenperf)")
    group.addoption(
        "--qwenperf-launcher",
        type=launcher_argv,
        help="command that starts a vLLM OpenAI server; model and flags are appended "
        "(default: python -m vllm.entrypoints.openai.api_server)",
    )
    group.addoption(
        "--qwenperf-boot-timeout", type=positive_seconds, help=f"seconds a server may take to become ready (default {DEFAULT_BOOT_TIMEOUT_S:.0f})"
    )
    group.addoption("--qwenperf-log-dir", type=Path, help="folder for server logs (default: under pytest's basetemp)")
    group.addoption(
        "--qwenperf-endpoint",
        type=endpoint_url,
        action="append",
        default=[],
        help="base URL of an already-running server; repeatable. Nothing is booted when given.",
    )
    parser.addini("qwenperf_launcher", "default for --qwenperf-launcher")
    parser.addini("qwenperf_boot_timeout", "default for --qwenperf-boot-timeout")
    parser.addini("qwenperf_log_dir", "default for --qwenperf-log-dir")
    parser.addini("qwenperf_endpoints", "default for --qwenperf-endpoint", type="linelist")


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    endpoints = config.getoption("qwenperf_endpoint") or [
        _from_ini(config, "qwenperf_endpoints", endpoint_url, line) for line in config.getini("qwenperf_endpoints")
    ]
    config.stash[SETTINGS_KEY] = QwenperfSettings(
        launcher=_resolve(config, "qwenperf_launcher", launcher_argv, DEFAULT_LAUNCHER),
        boot_timeout_s=_resolve(config, "qwenperf_boot_timeout", positive_seconds, DEFAULT_BOOT_TIMEOUT_S),
        log_dir=_resolve(config, "qwenperf_log_dir", Path, None),
        endpoints=tuple(endpoints),
    )
    _terminate_like_ctrl_c()


def _resolve(config: pytest.Config, name: str, parse: Callable[[str], _T], default: _T) -> _T:
    value = config.getoption(name)
    if value is not None:
        return value  # already parsed by argparse
    raw = config.getini(name)
    return _from_ini(config, name, parse, raw) if raw else default


def _from_ini(config: pytest.Config, name: str, parse: Callable[[str], _T], raw: str) -> _T:
    try:
        return parse(raw)
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(f"{config.inipath}: ini key {name}: {exc}") from None


def _terminate_like_ctrl_c() -> None:
    """Turn SIGTERM (CI cancellation, ``timeout``) into KeyboardInterrupt so teardown still runs."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:

        def _raise_interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, _raise_interrupt)


# ----------------------------------------------------------------- test ordering


def _config_of(item: pytest.Item) -> ServingConfig | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("serving_config") if callspec else None
    return value if isinstance(value, ServingConfig) else None


@pytest.hookimpl(trylast=True)  # after -m/-k deselection, so the use counts are right
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests by serving config, so each server boots once and stops after its last test."""
    first_seen: dict[str, int] = {}
    for item in items:
        cfg = _config_of(item)
        if cfg is not None:
            first_seen.setdefault(cfg.id, len(first_seen))
    items.sort(key=lambda item: first_seen[cfg.id] if (cfg := _config_of(item)) else -1)
    config.stash[_USES_KEY] = Counter(cfg.id for item in items if (cfg := _config_of(item)))


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def qwenperf_settings(pytestconfig: pytest.Config) -> QwenperfSettings:
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def qwenperf_pool(qwenperf_settings: QwenperfSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """All servers of the session; each config boots once and everything stops at the end."""
    pool = ServerPool(
        PoolSettings(
            log_dir=qwenperf_settings.log_dir or tmp_path_factory.mktemp("vllm-logs", numbered=False),
            launcher=qwenperf_settings.launcher,
            boot_timeout_s=qwenperf_settings.boot_timeout_s,
            endpoints=qwenperf_settings.endpoints,
        )
    )
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def serving_config(request: pytest.FixtureRequest) -> ServingConfig:
    """Parametrize this name with :class:`ServingConfig` objects to choose the server."""
    raise pytest.UsageError(
        f"{request.node.nodeid} uses vllm_server but no serving config was chosen: "
        "parametrize 'serving_config' with ServingConfig objects"
    )


@pytest.fixture
def vllm_server(request: pytest.FixtureRequest, serving_config: ServingConfig, qwenperf_pool: ServerPool) -> Iterator[Server]:
    """The running server for ``serving_config``; stopped after the last test that needs it."""
    try:
        yield qwenperf_pool.get(serving_config)
    finally:
        uses = request.config.stash.get(_USES_KEY, Counter())
        uses[serving_config.id] -= 1
        if uses[serving_config.id] <= 0:
            qwenperf_pool.release(serving_config.id)


# -------------------------------------------------------------- leftover guard


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After fixtures are torn down, no process this session started may be alive."""
    leftovers = proctree.tagged_processes(proctree.owner_prefix())
    if not leftovers:
        return
    described = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in leftovers]
    for proc in leftovers:
        proc.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("qwenperf: processes were still running after teardown (killed):", red=True)
        for line in described:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
