"""pytest glue: options, ini keys, markers, fixtures and hooks over the library.

Settings follow one path, CLI option → ini key → default, resolved once in
``pytest_configure`` into a frozen :class:`QwenperfSettings` kept in ``config.stash``.
Tests that ask for ``suite_workload`` are parametrized from the selected suite files,
one test per (config, workload), marked with the suite's hardware.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from pytest_qwenperf.core.apikey import (
    CLIENT_ENVS,
    ApiKey,
    ApiKeyError,
    key_from_environment,
    shown_command,
)
from pytest_qwenperf.core.files import unwritable, unwritable_folder
from pytest_qwenperf.core.options import (
    cpu_list,
    endpoint_url,
    launcher_argv,
    positive_seconds,
    whole_number,
)
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.baseline import (
    BaselineError,
    BaselineRefused,
    PublishedBaselineKept,
    find_baseline,
    parse_run,
    write_baseline,
)
from pytest_qwenperf.gate.judge import judge_run
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.run import RunResult, measure
from pytest_qwenperf.measure.scaling import Route
from pytest_qwenperf.serving import gpu_memory, proctree
from pytest_qwenperf.serving.endpoints import EndpointSets, endpoints_file
from pytest_qwenperf.serving.hardware import Hardware, detect
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.serving.router import RouterUnavailable, find_nginx
from pytest_qwenperf.serving.server import (
    DEFAULT_BOOT_TIMEOUT_S,
    DEFAULT_LAUNCHER,
    Server,
)
from pytest_qwenperf.suite.config import (
    ServingConfig,
    Suite,
    SuiteError,
    SuiteWorkload,
    load_suite,
)
from pytest_qwenperf.suite.workloads import SharedPrefixWorkload

pytest_plugins = ["pytest_qwenperf.plugin.benchmark"]  # pytest-benchmark machine_info and compare hooks

MARKERS = {
    "cpu": "runs on the CPU build of vLLM (the embedded default)",
    "gpu": "needs NVIDIA GPUs",
    "b200": "sized for one node of 8x NVIDIA B200",
    "h200": "sized for one node of 8x NVIDIA H200",
    "h100": "sized for one node of 8x NVIDIA H100",
    "scaling": "multi-replica scaling-efficiency tests",
    "qwenperf_select(name)": "only (config, workload) pairs of this kind: ladder, slo, speculative, prefix-cache, utilization, scaling",
}

SELECTORS: dict[str, Callable[[Suite, ServingConfig, SuiteWorkload], bool]] = {
    "all": lambda suite, cfg, wl: True,
    "ladder": lambda suite, cfg, wl: cfg.improves and cfg.inherits is not None and wl.runs_on(cfg.inherits),
    "slo": lambda suite, cfg, wl: wl.slo is not None,
    "speculative": lambda suite, cfg, wl: cfg.speculative,
    "utilization": lambda suite, cfg, wl: any(wl.floor(name, cfg.id) is not None for name in ("gpu_utilization", "server_cpu_busy")),
    "scaling": lambda suite, cfg, wl: cfg.replicas > 1,
    "prefix-cache": lambda suite, cfg, wl: (
        isinstance(wl.workload, SharedPrefixWorkload)
        and "--enable-prefix-caching" in cfg.vllm_args
        and cfg.inherits is not None
        and wl.runs_on(cfg.inherits)
    ),
}
"""Which (config, workload) pairs a test marked ``qwenperf_select(name)`` runs on: ``ladder``
compares a rung with the one it inherits from, ``prefix-cache`` a cached rung with its
uncached parent on a shared-prefix workload, ``utilization`` pairs with a utilization floor,
``scaling`` configs of several replicas (every config when an endpoints file names the sets)."""


@dataclass(frozen=True)
class QwenperfSettings:
    launcher: tuple[str, ...]
    boot_timeout_s: float
    log_dir: Path | None
    endpoints: tuple[str, ...]
    endpoint_sets: EndpointSets | None  # replicas already deployed, per replica count (multi-node scaling)
    suites: tuple[Path, ...]
    json_path: Path | None
    server_cpus: frozenset[int] | None  # None: the default placement for the suite's hardware
    client_cpus: frozenset[int] | None
    repeats: int | None  # None: each suite's own
    client_workers: int  # load-generator processes (one event loop each)
    baselines: Path
    update_baselines: bool
    replace_published: tuple[str, ...] = ()  # config keys or baseline files whose published figures a run may replace
    api_key: ApiKey | None = None  # from the environment (see _api_key); booted servers require it, requests carry it


SETTINGS_KEY = pytest.StashKey[QwenperfSettings]()
_USES_KEY = pytest.StashKey[Counter[str]]()
_SUITES_KEY = pytest.StashKey[tuple[Suite, ...]]()
_REPORT_KEY = pytest.StashKey[SessionReport]()
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
    group.addoption(
        "--qwenperf-endpoints-file",
        type=endpoints_file,
        help="TOML file naming, per replica count, the endpoints of servers already deployed (e.g. on several "
        "nodes); every config is measured against each set for its scaling efficiency. Nothing is booted.",
    )
    group.addoption(
        "--qwenperf-api-key-env",
        metavar="NAME",
        help=f"environment variable holding the API key of servers run with vLLM's --api-key (default: {' or '.join(CLIENT_ENVS)} "
        "when set). Servers the plugin boots require it (given to them as VLLM_API_KEY) and every request carries it. "
        "The key itself is never an option: command lines are visible in ps and shell histories.",
    )
    group.addoption(
        "--qwenperf-suite", type=Path, action="append", default=[], help="suite file to run (repeatable; default: ini qwenperf_suites)"
    )
    group.addoption("--qwenperf-json", type=Path, help="write the session's results (every run, boots per config) to this file")
    group.addoption("--qwenperf-server-cpus", type=cpu_list, help="CPUs for the servers, e.g. 0-6 (CPU suites default: all but the last)")
    group.addoption("--qwenperf-client-cpus", type=cpu_list, help="CPUs for the load generator (CPU suites default: the last one)")
    group.addoption("--qwenperf-repeats", type=whole_number(1), help="load runs per (config, workload) (default: the suite's repeats)")
    group.addoption(
        "--qwenperf-client-workers",
        type=whole_number(1),
        help="load-generator processes, each with its own event loop, for loads one process cannot drive (default 1)",
    )
    group.addoption("--qwenperf-baselines", type=Path, help="baseline folder (default: baselines/ under the rootdir)")
    group.addoption(
        "--qwenperf-update-baselines",
        action="store_true",
        help="after a session without failures, record its runs as the baselines (the previous values move to history)",
    )
    group.addoption(
        "--qwenperf-replace-published",
        action="append",
        default=[],
        metavar="CONFIG_OR_FILE",
        help="with --qwenperf-update-baselines: let the runs of this config (its key, e.g. b200/dp8) or this baseline "
        "file replace a baseline of published figures (repeatable; without it, published baselines are kept)",
    )
    parser.addini("qwenperf_launcher", "default for --qwenperf-launcher")
    parser.addini("qwenperf_boot_timeout", "default for --qwenperf-boot-timeout")
    parser.addini("qwenperf_log_dir", "default for --qwenperf-log-dir")
    parser.addini("qwenperf_endpoints", "default for --qwenperf-endpoint", type="linelist")
    parser.addini("qwenperf_suites", "suite files or globs, relative to the rootdir", type="linelist")
    parser.addini("qwenperf_repeats", "default for --qwenperf-repeats")
    parser.addini("qwenperf_client_workers", "default for --qwenperf-client-workers")
    parser.addini("qwenperf_baselines", "default for --qwenperf-baselines, relative to the rootdir")
    parser.addini("qwenperf_api_key_env", "default for --qwenperf-api-key-env (a variable name, never the key)")


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
        endpoint_sets=config.getoption("qwenperf_endpoints_file"),
        suites=tuple(config.getoption("qwenperf_suite")) or _ini_suites(config),
        json_path=config.getoption("qwenperf_json"),
        server_cpus=config.getoption("qwenperf_server_cpus"),
        client_cpus=config.getoption("qwenperf_client_cpus"),
        repeats=_resolve(config, "qwenperf_repeats", whole_number(1), None),
        client_workers=_resolve(config, "qwenperf_client_workers", whole_number(1), 1),
        baselines=config.rootpath / _resolve(config, "qwenperf_baselines", Path, Path("baselines")),
        update_baselines=config.getoption("qwenperf_update_baselines"),
        replace_published=tuple(config.getoption("qwenperf_replace_published")),
        api_key=_api_key(config),
    )
    _check_outputs(config.stash[SETTINGS_KEY])
    config.stash[_REPORT_KEY] = SessionReport()
    try:
        config.stash[_SUITES_KEY] = tuple(load_suite(p) for p in config.stash[SETTINGS_KEY].suites)
    except SuiteError as exc:
        raise pytest.UsageError(str(exc)) from None
    _terminate_like_ctrl_c()


def _api_key(config: pytest.Config) -> ApiKey | None:
    """The servers' API key: from the variable ``--qwenperf-api-key-env`` (ini ``qwenperf_api_key_env``)
    names, else from ``VLLM_API_KEY``, else ``OPENAI_API_KEY``; None when none is set."""
    option = config.getoption("qwenperf_api_key_env")
    name = option or config.getini("qwenperf_api_key_env") or None
    try:
        return key_from_environment(os.environ, name)
    except ApiKeyError as exc:
        where = "--qwenperf-api-key-env" if option else f"{config.inipath}: ini key qwenperf_api_key_env" if name else "qwenperf"
        raise pytest.UsageError(f"{where}: {exc}") from None


def _check_outputs(settings: QwenperfSettings) -> None:
    """Fail before any server boots when a result could not be written at the end of the session."""
    if settings.replace_published and not settings.update_baselines:
        raise pytest.UsageError("--qwenperf-replace-published: only takes effect with --qwenperf-update-baselines")
    if settings.json_path is not None and (why := unwritable(settings.json_path)):
        raise pytest.UsageError(f"--qwenperf-json {settings.json_path}: cannot write the results there: {why}")
    if settings.update_baselines and (why := unwritable_folder(settings.baselines)):
        raise pytest.UsageError(
            f"--qwenperf-update-baselines: cannot write baselines into the folder {settings.baselines} "
            f"(--qwenperf-baselines or ini qwenperf_baselines): {why}"
        )


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


def _ini_suites(config: pytest.Config) -> tuple[Path, ...]:
    paths: list[Path] = []
    for pattern in config.getini("qwenperf_suites"):
        matches = sorted(glob.glob(str(config.rootpath / pattern)))
        if not matches:
            raise pytest.UsageError(f"{config.inipath}: ini key qwenperf_suites: {pattern!r} matches no file")
        paths += [Path(m) for m in matches]
    return tuple(paths)


def _terminate_like_ctrl_c() -> None:
    """Turn SIGTERM (CI cancellation, ``timeout``) into KeyboardInterrupt so teardown still runs."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:

        def _raise_interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, _raise_interrupt)


# ------------------------------------------------------------ parametrization


def _suites(config: pytest.Config) -> tuple[Suite, ...]:
    return config.stash[_SUITES_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per (config, workload) of the selected suites, for tests asking for ``suite_workload``."""
    if "suite_workload" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("qwenperf_select")
    selector = marker.args[0] if marker else "all"
    if selector not in SELECTORS:
        raise ValueError(f"{metafunc.definition.nodeid}: qwenperf_select({selector!r}): expected one of {sorted(SELECTORS)}")
    settings = metafunc.config.stash[SETTINGS_KEY]
    external = bool(settings.endpoints or settings.endpoint_sets)
    if selector == "scaling" and settings.endpoint_sets is not None:
        selector = "all"  # the deployed sets are what scales, whichever config they run
    params = []
    for suite in _suites(metafunc.config):
        marks = [getattr(pytest.mark, suite.hardware)] + ([pytest.mark.gpu] if suite.gpus else [])
        for workload in suite.workloads:
            for cfg in suite.configs:
                if workload.runs_on(cfg.id) and SELECTORS[selector](suite, cfg, workload):
                    missing = None if external else _missing_hardware(suite, cfg, detect())
                    skip = [pytest.mark.skip(reason=missing)] if missing else []
                    params.append(pytest.param(cfg, workload, id=f"{suite.name}-{cfg.id}/{workload.id}", marks=marks + skip))
    metafunc.parametrize(("serving_config", "suite_workload"), params)


def _missing_hardware(suite: Suite, cfg: ServingConfig, hw: Hardware) -> str | None:
    """Why ``cfg`` cannot run on ``hw`` (a skip reason naming need and finding), or None."""
    if suite.gpus and (hw.kind != suite.hardware or hw.gpu_count < suite.gpus):
        return f"needs {suite.gpus}x {suite.hardware.upper()} GPUs (suite {suite.path.name}); found {hw.describe()}"
    if cfg.cpu_flags_any and not set(cfg.cpu_flags_any) & hw.cpu_flags:
        return f"needs a CPU with one of {list(cfg.cpu_flags_any)} (config {cfg.key}); found {hw.cpu_model or 'a CPU'} without"
    if cfg.routing == "nginx":
        try:
            find_nginx()
        except RouterUnavailable as exc:
            return f"config {cfg.key} routes through nginx: {exc}"
    return None


# ----------------------------------------------------------------- test ordering


def _config_of(item: pytest.Item) -> ServingConfig | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("serving_config") if callspec else None
    return value if isinstance(value, ServingConfig) else None


@pytest.hookimpl(trylast=True)  # after -m/-k deselection, so the use counts are right
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests by serving config, in ladder order, so each server boots once, stops after
    its last test, and a rung's parent has already been measured when the rung is compared."""
    rank: dict[str, tuple[int, ...]] = {}
    for s, suite in enumerate(_suites(config)):
        for c, cfg in enumerate(suite.configs):
            rank[cfg.key] = (0, s, c)
    for item in items:
        cfg = _config_of(item)
        if cfg is not None and cfg.key not in rank:
            rank[cfg.key] = (1, len(rank))
    items.sort(key=lambda item: rank[cfg.key] if (cfg := _config_of(item)) else (-1,))
    config.stash[_USES_KEY] = Counter(cfg.key for item in items if (cfg := _config_of(item)))


# ------------------------------------------------------------- before any boot


@pytest.hookimpl(trylast=True)  # after the terminal reporter's header
def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop what an earlier session that died left running (its servers would hold the
    ports, the cores or the GPUs this session is about to measure with)."""
    found = proctree.leftovers()
    if not found:
        return
    survivors = proctree.stop_leftovers(found)
    _say(session.config, f"qwenperf: stopped {len(found)} process(es) left running by a session that died:", red=True)
    for leftover in found:
        command = shown_command(leftover.argv)
        _say(session.config, f"  pid {leftover.pid} (started by pid {leftover.owner_pid}, gone): {command}", red=True)
    if survivors:
        raise pytest.UsageError(f"qwenperf: processes left by an earlier session survived SIGKILL: {survivors}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail before any boot when a GPU this session's servers need holds memory of another process."""
    settings = session.config.stash[SETTINGS_KEY]
    if settings.endpoints or settings.endpoint_sets:
        return
    suites = {suite.name: suite for suite in _suites(session.config)}
    visible = [
        dict(cfg.env).get("CUDA_VISIBLE_DEVICES")
        for item in session.items
        if (cfg := _config_of(item)) is not None
        and (suite := suites.get(cfg.suite)) is not None
        and suite.gpus
        and item.get_closest_marker("skip") is None
    ]
    held = gpu_memory.wait_until_free(visible) if visible else ()
    if held:
        raise pytest.UsageError(
            "qwenperf: GPU memory is in use by other processes on GPUs this session needs; stop them before "
            "measuring (nothing was booted):\n  " + "\n  ".join(holder.describe() for holder in held)
        )


def _say(config: pytest.Config, text: str, red: bool = False) -> None:
    """A line on pytest's terminal, or on stdout when its reporter is off (``-p no:terminal``)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=red)
    else:  # -p no:terminal
        print(text)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def qwenperf_settings(pytestconfig: pytest.Config) -> QwenperfSettings:
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def qwenperf_pool(
    pytestconfig: pytest.Config, qwenperf_settings: QwenperfSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool]:
    """All servers of the session; each config boots once and everything stops at the end."""
    pool = ServerPool(
        PoolSettings(
            log_dir=qwenperf_settings.log_dir or tmp_path_factory.mktemp("vllm-logs", numbered=False),
            launcher=qwenperf_settings.launcher,
            boot_timeout_s=qwenperf_settings.boot_timeout_s,
            endpoints=qwenperf_settings.endpoints or _set_urls(qwenperf_settings.endpoint_sets),
            endpoint_model=qwenperf_settings.endpoint_sets.model if qwenperf_settings.endpoint_sets else None,
            api_key=qwenperf_settings.api_key,
        )
    )
    pytestconfig.stash[_REPORT_KEY].boots = pool.boots
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


def _placement(cfg: ServingConfig, settings: QwenperfSettings) -> tuple[frozenset[int], frozenset[int]]:
    """Server and client CPUs: as set, else disjoint cores for the CPU build (repeatable figures).

    The CPU build's servers get every CPU but the last, the client the last; replicas split
    the servers' CPUs. When there are only as many CPUs as replicas, each replica gets one
    and the client is not pinned (it shares them: a 2-core machine measuring 2 replicas).
    """
    if settings.server_cpus is not None or settings.client_cpus is not None:
        return settings.server_cpus or frozenset(), settings.client_cpus or frozenset()
    cpus = sorted(detect().cpu_ids)
    if not cfg.model.startswith("embedded:") or len(cpus) < 2:
        return frozenset(), frozenset()
    if len(cpus) - 1 >= cfg.replicas:
        return frozenset(cpus[:-1]), frozenset(cpus[-1:])
    if len(cpus) >= cfg.replicas:
        return frozenset(cpus), frozenset()
    return frozenset(), frozenset()


def _gpu_ids(cfg: ServingConfig) -> tuple[str, ...]:
    """The GPUs a config's replicas share out (its own CUDA_VISIBLE_DEVICES, else every GPU); none for one server."""
    if cfg.replicas == 1:
        return ()
    visible = dict(cfg.env).get("CUDA_VISIBLE_DEVICES")
    return tuple(visible.split(",")) if visible else tuple(str(i) for i in range(detect().gpu_count))


def _set_urls(sets: EndpointSets | None) -> tuple[str, ...]:
    """Every URL of the endpoint sets, each once, in file order."""
    return tuple(dict.fromkeys(url for s in sets.sets for url in s.urls)) if sets else ()


def _routes(sets: EndpointSets) -> tuple[Route, ...]:
    """One route per set. A set with one URL per replica is the replicas themselves (their
    /metrics are read); a set with fewer URLs is a Service or gateway in front of them, whose
    /metrics would be one random pod's, so it is not read."""
    return tuple(Route(s.replicas, s.urls, s.urls if len(s.urls) == s.replicas else ()) for s in sets.sets)


@pytest.fixture
def vllm_server(
    request: pytest.FixtureRequest, serving_config: ServingConfig, qwenperf_pool: ServerPool, qwenperf_settings: QwenperfSettings
) -> Iterator[Server]:
    """The running server for ``serving_config``; stopped after the last test that needs it."""
    server_cpus, _ = _placement(serving_config, qwenperf_settings)
    try:
        yield qwenperf_pool.get(serving_config, server_cpus, _gpu_ids(serving_config))
    finally:
        uses = request.config.stash.get(_USES_KEY, Counter())
        uses[serving_config.key] -= 1
        if uses[serving_config.key] <= 0:
            qwenperf_pool.release(serving_config.key)


MeasureFn = Callable[[ServingConfig, SuiteWorkload], RunResult]


@pytest.fixture
def qwenperf_measure(pytestconfig: pytest.Config, qwenperf_pool: ServerPool, qwenperf_settings: QwenperfSettings) -> MeasureFn:
    """``measure(config, workload)``: the session's run of that pair, measured on first use.

    Tests comparing two rungs use it for the rung they are not parametrized with; the
    test ordering usually means that run already exists.
    """
    report = pytestconfig.stash[_REPORT_KEY]

    def _measure(cfg: ServingConfig, workload: SuiteWorkload) -> RunResult:
        result = report.get(cfg.key, workload.id)
        if result is None:
            server_cpus, client_cpus = _placement(cfg, qwenperf_settings)
            server = qwenperf_pool.get(cfg, server_cpus, _gpu_ids(cfg))
            suite = _suite_of(pytestconfig, cfg)
            sets = qwenperf_settings.endpoint_sets
            result = measure(
                server,
                cfg,
                workload,
                suite=cfg.suite,
                client_cpus=client_cpus,
                repeats=qwenperf_settings.repeats or suite.repeats,
                tolerances=suite.tolerances,
                routes=_routes(sets) if sets else None,
                workers=qwenperf_settings.client_workers,
                api_key=qwenperf_settings.api_key,
            )
            report.add(result)
        return result

    return _measure


@pytest.fixture
def qwenperf_run(serving_config: ServingConfig, suite_workload: SuiteWorkload, vllm_server: Server, qwenperf_measure: MeasureFn) -> RunResult:
    """The measured run of ``suite_workload`` on ``serving_config``: once per session, shared by tests."""
    return qwenperf_measure(serving_config, suite_workload)


@pytest.fixture
def qwenperf_suite(pytestconfig: pytest.Config, serving_config: ServingConfig) -> Suite:
    """The suite that defines ``serving_config``."""
    return _suite_of(pytestconfig, serving_config)


def _suite_of(config: pytest.Config, cfg: ServingConfig) -> Suite:
    found = next((s for s in _suites(config) if s.name == cfg.suite), None)
    if found is None:
        raise pytest.UsageError(f"config {cfg.key} belongs to no loaded suite; suites are {[s.name for s in _suites(config)]}")
    return found


@pytest.fixture
def qwenperf_judgements(qwenperf_run: RunResult, qwenperf_settings: QwenperfSettings) -> tuple[Judgement, ...]:
    """Every gated metric of the run against its stored baseline (see :func:`~pytest_qwenperf.core.verdict.judge_run`).

    A baseline file that cannot be read fails the test with the one line that names the
    file, the field and what was expected (no traceback: the fault is in the file)."""
    run = qwenperf_run.as_json()
    try:
        baseline = find_baseline(qwenperf_settings.baselines, parse_run(run).identity)
    except BaselineError as exc:
        unreadable = str(exc)
    else:
        return judge_run(baseline, run)
    pytest.fail(f"qwenperf: {unreadable}", pytrace=False)  # outside the except: no "during handling" chain


# -------------------------------------------------------------- session end


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    report = config.stash.get(_REPORT_KEY, None)
    if report is None or not report.runs:
        return
    terminalreporter.section("qwenperf results")
    for line in report.table():
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the JSON report; then, after fixtures are torn down, check that no process of ours survived."""
    config = session.config
    settings = config.stash.get(SETTINGS_KEY, None)
    report = config.stash.get(_REPORT_KEY, None)
    if settings is not None and settings.json_path is not None and report is not None:
        kept = report.write_json(settings.json_path)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            note = f" (previous file kept as {kept})" if kept else ""
            reporter.write_line(f"qwenperf: results written to {settings.json_path}{note}")
    if settings is not None and settings.update_baselines and report is not None:
        _update_baselines(session, settings, report)
    _fail_on_leftovers(session)


def _update_baselines(session: pytest.Session, settings: QwenperfSettings, report: SessionReport) -> None:
    """Record the session's runs as baselines, only when no test failed; say what was written and refused."""
    if session.testsfailed:
        _say(session.config, f"qwenperf: baselines not updated: {session.testsfailed} test(s) failed", red=True)
        return
    named_files = {Path(name).resolve() for name in settings.replace_published}
    for run in report.runs:
        data = run.as_json()
        target = parse_run(data).identity.path(settings.baselines)
        replace = run.config.key in settings.replace_published or target.resolve() in named_files
        try:
            path = write_baseline(
                settings.baselines, data, source="pytest --qwenperf-update-baselines", replace_published=replace
            )
        except PublishedBaselineKept as exc:
            _say(
                session.config,
                f"qwenperf: {exc}; to replace them, name the config or the file: "
                f"--qwenperf-replace-published {run.config.key} or --qwenperf-replace-published {target}",
                red=True,
            )
        except (BaselineRefused, BaselineError) as exc:
            _say(session.config, f"qwenperf: {exc}", red=True)
        else:
            _say(session.config, f"qwenperf: baseline written: {path}")


def _fail_on_leftovers(session: pytest.Session) -> None:
    leftovers = proctree.tagged_processes(proctree.owner_prefix())
    if not leftovers:
        return
    described = [f"{p.pid} {shown_command(proctree.command_of(p))}" for p in leftovers]
    for proc in leftovers:
        proc.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("qwenperf: processes were still running after teardown (killed):", red=True)
        for line in described:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
