"""The plugin's settings, resolved once per session: CLI option → ini key → default.

The repeats of a point are resolved per suite (:func:`repeat_plan`): ``--qwenperf-repeats``
→ ini → the suite's ``repeats``; the most a point may take while its verdicts cannot decide,
``--qwenperf-max-repeats`` → ini → the suite's ``max_repeats`` → the repeats in force.

:func:`resolve_settings` reads them in ``pytest_configure`` into a frozen
:class:`QwenperfSettings`; the hooks keep it, the loaded suites and the session's report
in ``config.stash`` under the keys below.
"""

from __future__ import annotations

import argparse
import glob
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from pytest_qwenperf.core.apikey import ApiKey, ApiKeyError, key_from_environment
from pytest_qwenperf.core.files import unwritable, unwritable_folder
from pytest_qwenperf.core.options import (
    DEFAULT_BOOT_TIMEOUT_S,
    DEFAULT_HISTORY,
    ProgressSetting,
    endpoint_url,
    launcher_argv,
    positive_seconds,
    progress_setting,
    whole_number,
)
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.verdict import DEFAULT_CONFIDENCE
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore, is_url
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.serving.endpoints import EndpointSets
from pytest_qwenperf.serving.pool import ServerPool
from pytest_qwenperf.serving.server import DEFAULT_LAUNCHER
from pytest_qwenperf.serving.sleep import Turns
from pytest_qwenperf.suite.config import Suite


@dataclass(frozen=True)
class QwenperfSettings:
    launcher: tuple[str, ...]
    candidate: tuple[str, ...] | None  # a second launcher, measured interleaved with the first and judged against it
    boot_timeout_s: float
    log_dir: Path | None
    endpoints: tuple[str, ...]
    endpoint_sets: EndpointSets | None  # replicas already deployed, per replica count (multi-node scaling)
    suites: tuple[Path, ...]
    json_path: Path | None
    html_path: Path | None  # the session's HTML report
    server_cpus: frozenset[int] | None  # None: the default placement for the suite's hardware
    client_cpus: frozenset[int] | None
    repeats: int | None  # None: each suite's own
    max_repeats: int | None  # None: each suite's max_repeats, else the repeats in force
    client_workers: int  # load-generator processes (one event loop each)
    baselines: Path
    update_baselines: bool
    allow_invalid: bool = False  # an invalid run skips its tests with the reason instead of failing them
    replace_published: tuple[str, ...] = ()  # config keys or baseline files whose published figures a run may replace
    api_key: ApiKey | None = None  # from the environment (see _api_key); booted servers require it, requests carry it
    history: HistorySetting | None = None  # where the session's runs are recorded; None: nowhere (--qwenperf-no-history)
    ray: str | None = None  # the Ray cluster whose nodes run the client workers as actors; None: this machine
    repeats_from: str = ""  # the option or ini key repeats came from, for messages ("": neither)
    max_repeats_from: str = ""  # the same for max_repeats
    progress: ProgressSetting = field(default_factory=ProgressSetting)  # each point's live progress on the terminal
    profile: bool = False  # servers boot with vLLM's profiler; each point gets one extra, unmeasured, profiled repeat
    vllm_cache: Path | None = None  # where booted servers keep vLLM's compile and model-info caches; None: vLLM's default
    llmd_report: Path | None = None  # the folder each run's llm-d Benchmark Report goes into; None: none written


@dataclass(frozen=True)
class HistorySetting:
    """The history store a session records its runs in: ``where``, an SQLite path or a
    ``postgresql://`` URL. ``named`` by the option or the ini key: opened (created or migrated)
    before anything is measured. Else the default store (:data:`DEFAULT_HISTORY`), made only when
    a session has runs to record, so a session that measures nothing leaves no file behind."""

    where: str
    named: bool


SETTINGS_KEY = pytest.StashKey[QwenperfSettings]()
SUITES_KEY = pytest.StashKey[tuple[Suite, ...]]()
REPORT_KEY = pytest.StashKey[SessionReport]()
"""The session's runs: every measured (config, workload), written at the end of the session."""
POOLS_KEY = pytest.StashKey[dict[str, ServerPool]]()
"""The session's server pools by role ("launcher", "candidate"): their boot counts go into the JSON."""
TURNS_KEY = pytest.StashKey[Turns]()
"""The turns the launcher's and the candidate's servers take on the GPUs; absent where both stay awake."""
USES_KEY = pytest.StashKey[Counter[str]]()
"""Config key → collected tests still to use its server (it stops after the last)."""
_T = TypeVar("_T")


def resolve_settings(config: pytest.Config) -> QwenperfSettings:
    """The session's settings; a :class:`pytest.UsageError` names the option or ini key of a bad value,
    and one whose results could not be written at the end of the session."""
    endpoints = config.getoption("qwenperf_endpoint") or [
        _from_ini(config, "qwenperf_endpoints", endpoint_url, line) for line in config.getini("qwenperf_endpoints")
    ]
    settings = QwenperfSettings(
        launcher=_resolve(config, "qwenperf_launcher", launcher_argv, DEFAULT_LAUNCHER),
        candidate=_resolve(config, "qwenperf_candidate", launcher_argv, None),
        boot_timeout_s=_resolve(config, "qwenperf_boot_timeout", positive_seconds, DEFAULT_BOOT_TIMEOUT_S),
        log_dir=_resolve(config, "qwenperf_log_dir", Path, None),
        vllm_cache=_resolve(config, "qwenperf_vllm_cache", Path, None),
        endpoints=tuple(endpoints),
        endpoint_sets=config.getoption("qwenperf_endpoints_file"),
        suites=tuple(config.getoption("qwenperf_suite")) or _ini_suites(config),
        json_path=config.getoption("qwenperf_json"),
        html_path=_rooted(config, "qwenperf_html"),
        llmd_report=_rooted(config, "qwenperf_llmd_report"),
        server_cpus=config.getoption("qwenperf_server_cpus"),
        client_cpus=config.getoption("qwenperf_client_cpus"),
        repeats=_resolve(config, "qwenperf_repeats", whole_number(1), None),
        max_repeats=_resolve(config, "qwenperf_max_repeats", whole_number(1), None),
        client_workers=_resolve(config, "qwenperf_client_workers", whole_number(1), 1),
        ray=_resolve(config, "qwenperf_ray", str, None),
        baselines=config.rootpath / _resolve(config, "qwenperf_baselines", Path, Path("baselines")),
        update_baselines=config.getoption("qwenperf_update_baselines"),
        allow_invalid=_flag(config, "qwenperf_allow_invalid"),
        replace_published=tuple(config.getoption("qwenperf_replace_published")),
        api_key=_api_key(config),
        history=_history(config),
        repeats_from=_origin(config, "qwenperf_repeats"),
        max_repeats_from=_origin(config, "qwenperf_max_repeats"),
        progress=_resolve(config, "qwenperf_progress", progress_setting, ProgressSetting()),
        profile=_flag(config, "qwenperf_profile"),
    )
    _check_outputs(settings)
    return settings


def _rooted(config: pytest.Config, name: str) -> Path | None:
    """A path option as given (relative to the working directory, as --qwenperf-json), else its ini key under the rootdir."""
    given = config.getoption(name)
    if given is not None:
        return Path(given)
    ini = config.getini(name)
    return config.rootpath / ini if ini else None


def _flag(config: pytest.Config, name: str) -> bool:
    """A switch: given on the command line, else the ini key (``true``/``false``), else off."""
    given = config.getoption(name)
    return bool(config.getini(name)) if given is None else bool(given)


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


def _history(config: pytest.Config) -> HistorySetting | None:
    """The history store: none with ``--qwenperf-no-history`` (or the ini switch), else
    ``--qwenperf-history`` as given, else ini ``qwenperf_history`` (a relative path is the
    rootdir's), else :data:`DEFAULT_HISTORY` under the rootdir."""
    if _flag(config, "qwenperf_no_history"):
        if config.getoption("qwenperf_history"):
            raise pytest.UsageError("--qwenperf-history and --qwenperf-no-history: choose one")
        return None
    option = config.getoption("qwenperf_history")
    if option:
        return HistorySetting(str(option), named=True)
    value = str(config.getini("qwenperf_history") or "").strip()
    if value:
        return HistorySetting(value if is_url(value) else str(config.rootpath / value), named=True)
    return HistorySetting(str(config.rootpath / DEFAULT_HISTORY), named=False)


def open_history(setting: HistorySetting) -> HistoryStore:
    """The store to record in; the default one's folder is made with its ``.gitignore`` first."""
    if not setting.named:
        folder = Path(setting.where).parent
        folder.mkdir(parents=True, exist_ok=True)
        ignore = folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# made by pytest-qwenperf: the local history store stays out of git\n*\n")
    return HistoryStore.open(setting.where)


def _check_outputs(settings: QwenperfSettings) -> None:
    """Fail before any server boots when a result could not be written at the end of the session."""
    if settings.replace_published and not settings.update_baselines:
        raise pytest.UsageError("--qwenperf-replace-published: only takes effect with --qwenperf-update-baselines")
    if settings.candidate is not None:
        _check_candidate(settings)
    if settings.history is not None and settings.history.named:
        try:
            HistoryStore.open(settings.history.where).close()  # created or migrated now, not after the measurement
        except HistoryError as exc:
            raise pytest.UsageError(f"--qwenperf-history (or ini qwenperf_history): {exc}") from None
    if settings.html_path is not None and (why := unwritable(settings.html_path)):
        raise pytest.UsageError(f"--qwenperf-html {settings.html_path} (or ini qwenperf_html): cannot write the report there: {why}")
    if settings.json_path is not None and (why := unwritable(settings.json_path)):
        raise pytest.UsageError(f"--qwenperf-json {settings.json_path}: cannot write the results there: {why}")
    if settings.llmd_report is not None and (why := unwritable_folder(settings.llmd_report)):
        raise pytest.UsageError(f"--qwenperf-llmd-report {settings.llmd_report} (or ini qwenperf_llmd_report): cannot write reports there: {why}")
    profiles = profiles_path(settings)
    if profiles is not None and (why := unwritable_folder(profiles)):
        raise pytest.UsageError(f"--qwenperf-profile: cannot keep the traces beside --qwenperf-json, in {profiles}: {why}")
    reference = reference_path(settings)
    if reference is not None and (why := unwritable(reference)):
        raise pytest.UsageError(f"--qwenperf-json {settings.json_path}: cannot write the reference's runs beside it, to {reference}: {why}")
    if settings.update_baselines and (why := unwritable_folder(settings.baselines)):
        raise pytest.UsageError(
            f"--qwenperf-update-baselines: cannot write baselines into the folder {settings.baselines} "
            f"(--qwenperf-baselines or ini qwenperf_baselines): {why}"
        )


def _check_candidate(settings: QwenperfSettings) -> None:
    """A candidate is booted beside the launcher's server: not with servers already running, and
    its runs, judged against the launcher's, are no baselines."""
    if settings.endpoints or settings.endpoint_sets:
        raise pytest.UsageError(
            "--qwenperf-candidate: boots a second server beside the launcher's; it cannot be measured against "
            "--qwenperf-endpoint or --qwenperf-endpoints-file servers, which are not booted"
        )
    if settings.update_baselines:
        raise pytest.UsageError(
            "--qwenperf-candidate: a session that measures a candidate judges it against the launcher's server, "
            "not against baselines; record baselines in a session without --qwenperf-candidate"
        )


def reference_path(settings: QwenperfSettings) -> Path | None:
    """Where the launcher's runs are written in a session with a candidate: beside ``--qwenperf-json``,
    ``results.json`` → ``results.reference.json`` (the candidate's runs are the session's results)."""
    if settings.candidate is None or settings.json_path is None:
        return None
    return settings.json_path.with_name(f"{settings.json_path.stem}.reference{settings.json_path.suffix}")


def profiles_path(settings: QwenperfSettings) -> Path | None:
    """Where the operator profiles' traces go with ``--qwenperf-profile``: beside ``--qwenperf-json``,
    ``results.json`` → ``results.profiles/``; None without a JSON path (or without profiling)."""
    if not settings.profile or settings.json_path is None:
        return None
    return settings.json_path.with_name(f"{settings.json_path.stem}.profiles")


def repeat_plan(settings: QwenperfSettings, suite: Suite) -> SequentialPlan:
    """How many repeats a point of ``suite`` takes first and at most; a :class:`pytest.UsageError`
    names both numbers and where they came from when a most given as an option or ini key is below
    the first (a suite's own ``max_repeats`` rises to the repeats in force)."""
    first, first_from = (settings.repeats, settings.repeats_from) if settings.repeats else (suite.repeats, f"{suite.path}: suite.repeats")
    if settings.max_repeats:
        most, most_from = settings.max_repeats, settings.max_repeats_from
    elif suite.max_repeats is not None:
        # A suite's budget is its own default: more repeats asked for on the command line raise it.
        most, most_from = max(suite.max_repeats, first), f"{suite.path}: suite.max_repeats"
    else:
        most, most_from = first, first_from
    if most < first:
        raise pytest.UsageError(
            f"qwenperf: suite {suite.name}: max repeats {most} ({most_from}) is below the repeats in force, "
            f"{first} ({first_from}); expected a max of at least {first}"
        )
    # A suite's earliest look comes before its first repeats in force, or not at all.
    least = suite.min_repeats if suite.min_repeats is not None and suite.min_repeats < first else None
    return SequentialPlan(DEFAULT_CONFIDENCE, first, most, least)


def _origin(config: pytest.Config, name: str) -> str:
    """Where a setting's value came from: its option, its ini key, or nowhere ("")."""
    if config.getoption(name) is not None:
        return "--" + name.replace("_", "-")
    return f"{config.inipath}: ini key {name}" if config.getini(name) else ""


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
