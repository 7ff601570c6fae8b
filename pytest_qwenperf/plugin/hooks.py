"""pytest glue: options, ini keys, markers and hooks over the library.

Settings follow one path, CLI option → ini key → default, resolved once in
``pytest_configure`` (:mod:`~pytest_qwenperf.plugin.settings`) and kept in ``config.stash``;
the fixtures live in :mod:`~pytest_qwenperf.plugin.fixtures`. Tests that ask for
``suite_workload`` are parametrized from the selected suite files, one test per
(config, workload), marked with the suite's hardware.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest

from pytest_qwenperf import __version__
from pytest_qwenperf.gate.compare import CompareError, load_runs
from pytest_qwenperf.gate.history_store import HistoryError, HistoryStore
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.gate.llmd_report import llmd_report, write_llmd_report
from pytest_qwenperf.gate.update import update_baselines
from pytest_qwenperf.history.report import Series
from pytest_qwenperf.measure.report import ServersSpent, SessionReport, write_session_json
from pytest_qwenperf.measure.session_table import Column, session_table
from pytest_qwenperf.option_table import add_plugin_options
from pytest_qwenperf.plugin import hookspec
from pytest_qwenperf.plugin.planning import end_lines, plan_session, start_lines
from pytest_qwenperf.plugin.progress import end_live_line
from pytest_qwenperf.plugin.settings import (
    POOLS_KEY,
    REPORT_KEY,
    SETTINGS_KEY,
    SUITES_KEY,
    TURNS_KEY,
    USES_KEY,
    HistorySetting,
    QwenperfSettings,
    open_history,
    reference_path,
    repeat_plan,
    resolve_settings,
)
from pytest_qwenperf.report.html import ReportUnavailable, write_report
from pytest_qwenperf.report.page import history_series
from pytest_qwenperf.serving import gpu_memory, proctree
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import missing_hardware
from pytest_qwenperf.serving.pool import ServerPool
from pytest_qwenperf.serving.sleep import Turns, turns_problem
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteError, load_suite
from pytest_qwenperf.suite.selectors import selected_pairs, tier_of
from pytest_qwenperf.suite.vllm_args import launcher_python

pytest_plugins = [
    "pytest_qwenperf.plugin.fixtures",
    "pytest_qwenperf.plugin.benchmark",  # pytest-benchmark machine_info and compare hooks
]

MARKERS = {
    "cpu": "runs on the CPU build of vLLM (the embedded default)",
    "gpu": "needs NVIDIA GPUs",
    "b200": "sized for one node of 8x NVIDIA B200",
    "h200": "sized for one node of 8x NVIDIA H200",
    "h100": "sized for one node of 8x NVIDIA H100",
    "hopper": "sized for one Hopper GPU (H100, H200 or GH200): the one-GPU ladder on the generated embedded:gpu model",
    "scaling": "multi-replica scaling-efficiency tests",
    "weekly": "a point of a suite's weekly tier (its config, its workload or a config its test also measures says tier = "
    '"weekly"): the nightly run is -m "<hardware> and not weekly"',
    "qwenperf_select(name)": "only (config, workload) pairs of this kind: ladder, slo, speculative, prefix-cache, utilization, "
    "scaling, canary, canary-floor, trace, capacity, capacity-order",
}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("qwenperf", "vLLM performance gates (pytest-qwenperf)")
    add_plugin_options(group.addoption, parser.addini)


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    config.stash[SETTINGS_KEY] = settings = resolve_settings(config)
    config.stash[REPORT_KEY] = report = SessionReport()
    config.stash[POOLS_KEY] = {}
    if settings.candidate is not None:
        report.reference = SessionReport()
    try:
        config.stash[SUITES_KEY] = suites = tuple(_with_server_args(config, load_suite(p)) for p in settings.suites)
    except SuiteError as exc:
        raise pytest.UsageError(str(exc)) from None
    for suite in suites:
        repeat_plan(settings, suite)  # a most below the repeats in force fails before anything boots
    _terminate_like_ctrl_c()


def _with_server_args(config: pytest.Config, suite: Suite) -> Suite:
    """``suite`` with each config's vLLM flags and environment as ``pytest_qwenperf_server_args`` left
    them: the session boots, records and judges the configs so changed."""
    configs = []
    for serving in suite.configs:
        args, env = list(serving.vllm_args), dict(serving.env)
        config.hook.pytest_qwenperf_server_args(config=config, serving=serving, args=args, env=env)
        configs.append(dataclasses.replace(serving, vllm_args=tuple(args), env=tuple(env.items())))
    return dataclasses.replace(suite, configs=tuple(configs))


def _terminate_like_ctrl_c() -> None:
    """Turn SIGTERM (CI cancellation, ``timeout``) into KeyboardInterrupt so teardown still runs."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:

        def _raise_interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, _raise_interrupt)


# ------------------------------------------------------------ parametrization


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per (config, workload) of the selected suites, for tests asking for ``suite_workload``."""
    if "suite_workload" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("qwenperf_select")
    selector = marker.args[0] if marker else "all"
    settings = metafunc.config.stash[SETTINGS_KEY]
    suites = metafunc.config.stash[SUITES_KEY]
    try:
        pairs = selected_pairs(suites, selector, deployed_sets=settings.endpoint_sets is not None)
    except ValueError as exc:
        raise ValueError(f"{metafunc.definition.nodeid}: {exc}") from None
    external = bool(settings.endpoints or settings.endpoint_sets)
    params = []
    for pair in pairs:
        marks = [getattr(pytest.mark, pair.suite.hardware)] + ([pytest.mark.gpu] if pair.suite.gpus else [])
        if tier_of(selector, pair.suite, pair.config, pair.workload) == "weekly":
            marks.append(pytest.mark.weekly)
        missing = None if external else missing_hardware(pair.suite, pair.config, detect())
        skip = [pytest.mark.skip(reason=missing)] if missing else []
        params.append(
            pytest.param(pair.config, pair.workload, id=f"{pair.suite.name}-{pair.config.id}/{pair.workload.id}", marks=marks + skip)
        )
    metafunc.parametrize(("serving_config", "suite_workload"), params)


# ----------------------------------------------------------------- test ordering


def _config_of(item: pytest.Item) -> ServingConfig | None:
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get("serving_config") if callspec else None
    return value if isinstance(value, ServingConfig) else None


@pytest.hookimpl(trylast=True)  # after -m/-k deselection, so the use counts are right
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group tests by serving config, in ladder order, so each server boots once, stops after
    its last test, and a rung's parent has already been measured when the rung is compared; then
    plan the session (:mod:`~pytest_qwenperf.plugin.planning`)."""
    rank: dict[str, tuple[int, ...]] = {}
    suites = config.stash[SUITES_KEY]
    for s, suite in enumerate(suites):
        for c, known in enumerate(suite.configs):
            rank[known.key] = (0, s, c)
    for item in items:
        cfg = _config_of(item)
        if cfg is not None and cfg.key not in rank:
            rank[cfg.key] = (1, len(rank))
    items.sort(key=lambda item: rank[found.key] if (found := _config_of(item)) else (-1,))
    config.stash[USES_KEY] = Counter(cfg.key for item in items if (cfg := _config_of(item)))
    plan_session(config, items)  # the terminal says it once collection is done (pytest_report_collectionfinish)


# ------------------------------------------------------------- before any boot


@pytest.hookimpl(trylast=True)  # after the terminal reporter's header
def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop what an earlier session that died left running (its servers would hold the
    ports, the cores or the GPUs this session is about to measure with)."""
    sweep = proctree.stop_orphaned_trees()
    if not sweep.stopped:
        return
    _say(session.config, f"qwenperf: stopped {len(sweep.stopped)} process(es) left running by a session that died:", red=True)
    for line in sweep.stopped:
        _say(session.config, f"  {line}", red=True)
    if sweep.survivors:
        raise pytest.UsageError(f"qwenperf: processes left by an earlier session survived SIGKILL: {list(sweep.survivors)}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail before any boot when a selected GPU config is to be measured against a candidate, or
    when a GPU this session's servers need holds memory of another process."""
    settings = session.config.stash[SETTINGS_KEY]
    if settings.endpoints or settings.endpoint_sets:
        return
    suites = {suite.name: suite for suite in session.config.stash[SUITES_KEY]}
    selected = [
        (cfg, suite.gpus)
        for item in session.items
        if (cfg := _config_of(item)) is not None and (suite := suites.get(cfg.suite)) is not None and item.get_closest_marker("skip") is None
    ]
    on_gpus = [cfg for cfg, gpus in selected if gpus]
    if on_gpus and settings.candidate is not None:
        session.config.stash[TURNS_KEY] = _turns(settings, on_gpus, sorted({cfg.key for cfg, gpus in selected if not gpus}))
    visible = [dict(cfg.env).get("CUDA_VISIBLE_DEVICES") for cfg in on_gpus]
    held = gpu_memory.wait_until_free(visible) if visible else ()
    if held:
        raise pytest.UsageError(
            "qwenperf: GPU memory is in use by other processes on GPUs this session needs; stop them before "
            "measuring (nothing was booted):\n  " + "\n  ".join(holder.describe() for holder in held)
        )


def _turns(settings: QwenperfSettings, on_gpus: list[ServingConfig], on_cpus: list[str]) -> Turns:
    """The turns the launcher's and the candidate's servers take on the GPUs (through vLLM's sleep mode),
    or a usage error saying why they cannot, before anything boots. ``on_cpus``: the selected configs
    that need no GPU (they are measured side by side, both awake)."""
    assert settings.candidate is not None
    if on_cpus:
        raise pytest.UsageError(
            "qwenperf: --qwenperf-candidate measures GPU configs taking turns on the GPUs and CPU configs side by side, "
            f"not both in one session; deselect {', '.join(on_cpus)} or the GPU configs (nothing was booted)"
        )
    pythons = (launcher_python(settings.launcher), launcher_python(settings.candidate))
    problem = turns_problem(dict.fromkeys(on_gpus), pythons)
    if problem is not None:
        raise pytest.UsageError(
            "qwenperf: --qwenperf-candidate on GPU configs keeps both servers booted, taking turns on the GPUs "
            f"through vLLM's sleep mode, which cannot work here: {problem}. Measure each vLLM in a session of its "
            "own and judge them with qwenperf compare (nothing was booted)"
        )
    return Turns()


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """The session's plan, said before anything boots."""
    report = config.stash.get(REPORT_KEY, None)
    return start_lines(report.plans) if report is not None else []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item) -> None:
    """End a point's live progress line before pytest reports the phase that drew it."""
    end_live_line(item.config)


def _say(config: pytest.Config, text: str, red: bool = False) -> None:
    """A line on pytest's terminal, or on stdout when its reporter is off (``-p no:terminal``)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=red)
    else:  # -p no:terminal
        print(text)


# -------------------------------------------------------------- session end


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    report = config.stash.get(REPORT_KEY, None)
    if report is None or not report.runs:
        return
    columns: list[Column] = [column for added in config.hook.pytest_qwenperf_session_columns(config=config) for column in added or ()]
    terminalreporter.section("qwenperf results" if report.reference is None else "qwenperf results: the candidate")
    for line in session_table(report, columns):
        terminalreporter.write_line(line)
    if report.reference is not None and report.reference.runs:
        terminalreporter.section("qwenperf results: the reference (--qwenperf-launcher), repeats interleaved with the candidate's")
        for line in session_table(report.reference, columns):
            terminalreporter.write_line(line)
    for line in end_lines(config, list(config.stash.get(POOLS_KEY, {}).values())):
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the JSON report; then, after fixtures are torn down, check that no process of ours survived."""
    config = session.config
    settings = config.stash.get(SETTINGS_KEY, None)
    report = config.stash.get(REPORT_KEY, None)
    if settings is not None and settings.json_path is not None and report is not None:
        pools = config.stash.get(POOLS_KEY, {})
        launcher, candidate = pools.get("launcher"), pools.get("candidate")
        _write_results(config, report, settings.json_path, (candidate if report.reference is not None else launcher))
        reference = reference_path(settings)
        if report.reference is not None and reference is not None:
            _write_results(config, report.reference, reference, launcher)
    if settings is not None and settings.llmd_report is not None and report is not None:
        _write_llmd_reports(config, report, settings.llmd_report)
    if settings is not None and settings.history is not None and report is not None and report.runs:
        _record_history(session, settings.history, report)
    if settings is not None and settings.html_path is not None and report is not None and report.runs:
        _write_html(session, report, settings)
    if settings is not None and settings.update_baselines and report is not None:
        update = update_baselines(
            settings.baselines,
            report.runs,
            failed_tests=session.testsfailed,
            replace_published=settings.replace_published,
            source="pytest --qwenperf-update-baselines",
            canaries=report.canaries.values(),
        )
        if update.failed_tests:
            _say(config, f"qwenperf: baselines not updated: {update.failed_tests} test(s) failed", red=True)
        for outcome in update.outcomes:
            if outcome.refused is None:
                _say(config, f"qwenperf: baseline written: {outcome.path}")
            elif outcome.published_kept:
                _say(
                    config,
                    f"qwenperf: {outcome.refused}; to replace them, name the config or the file: "
                    f"--qwenperf-replace-published {outcome.config_key} or --qwenperf-replace-published {outcome.path}",
                    red=True,
                )
            else:
                _say(config, f"qwenperf: {outcome.refused}", red=True)
    _fail_on_leftovers(session)


def _record_history(session: pytest.Session, where: HistorySetting, report: SessionReport) -> None:
    """Add the session's runs (a candidate's, in a session that measures one) to the history store;
    a store that fails now fails the session, so the loss is seen (the JSON report is written first)."""
    try:
        with open_history(where) as store:
            added = store.append(report.runs, source="pytest")
    except (HistoryError, OSError) as exc:
        _say(session.config, f"qwenperf: the runs were not recorded in the history store: {exc}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    _say(session.config, f"qwenperf: {added} run(s) recorded in the history store {store.where}")
    first = [run for run in report.runs if run.reference is None and not losses(run)] if report.reference is None else []
    if first:
        _say(
            session.config,
            f"qwenperf: {len(first)} of {len(report.runs)} point(s) had no stored baseline and no history to be judged "
            "against: this session's runs are now their reference on this machine, and the next session is judged against them",
        )


def _write_html(session: pytest.Session, report: SessionReport, settings: QwenperfSettings) -> None:
    """The report of the session's runs (with a candidate: the candidate's against the reference's),
    read back from their JSON as ``qwenperf report`` reads it, so both draw the same page, with the
    points' series from the history store the runs were recorded in; a report that cannot be
    written fails the session."""
    path = settings.html_path
    assert path is not None, "called for a session that writes one"
    with tempfile.TemporaryDirectory(prefix="qwenperf-report-") as folder:
        sessions = [report.reference, report] if report.reference is not None and report.reference.runs else [report]
        paths = [Path(folder) / f"{i}.json" for i in range(len(sessions))]
        for part, json_path in zip(sessions, paths, strict=True):
            part.write_json(json_path)
        try:
            kept = write_report([load_runs(json_path) for json_path in paths], path, history=_history_series(settings.history))
        except (CompareError, ReportUnavailable, HistoryError, OSError) as exc:
            _say(session.config, f"qwenperf: the HTML report was not written: {exc}", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
    note = f" (previous file kept as {kept})" if kept else ""
    _say(session.config, f"qwenperf: HTML report written to {path}{note}")


def _history_series(where: HistorySetting | None) -> list[Series]:
    """The report's series from the session's history store; none where it records in none, or its store was never made."""
    if where is None or not (where.named or Path(where.where).exists()):
        return []
    with HistoryStore.open(where.where, create=False) as store:
        return history_series(store)


def _write_results(config: pytest.Config, report: SessionReport, path: Path, pool: ServerPool | None) -> None:
    """``pool``: the servers the report's runs were measured on (how often each booted); the turns
    are the session's, shared by both sides."""
    turns = config.stash.get(TURNS_KEY, None)
    spent = ServersSpent(
        pool.boots if pool is not None else {}, pool.boot_seconds if pool is not None else {}, turns.counts if turns is not None else None
    )
    data = report.as_json(spent)
    config.hook.pytest_qwenperf_session_json(config=config, data=data)
    kept = write_session_json(path, data)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        note = f" (previous file kept as {kept})" if kept else ""
        reporter.write_line(f"qwenperf: results written to {path}{note}")


def _write_llmd_reports(config: pytest.Config, report: SessionReport, folder: Path) -> None:
    """Each run's llm-d Benchmark Report into ``folder`` (the launcher's, with a candidate, into ``folder/reference``)."""
    sides = [(report, folder)] + ([(report.reference, folder / "reference")] if report.reference is not None else [])
    written = [
        write_llmd_report(where, llmd_report(run, tool_version=__version__), f"{run.config_key}--{run.identity.workload}")
        for side, where in sides
        for run in side.runs
    ]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and written:
        reporter.write_line(f"qwenperf: {len(written)} llm-d Benchmark Report(s) written to {folder}")


def _fail_on_leftovers(session: pytest.Session) -> None:
    killed = proctree.kill_own_trees()
    if not killed:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("qwenperf: processes were still running after teardown (killed):", red=True)
        for line in killed:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
