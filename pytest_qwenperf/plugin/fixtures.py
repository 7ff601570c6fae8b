"""The plugin's fixtures: the session's servers, the measured runs and their judgements.

Registered through ``pytest_plugins`` of :mod:`pytest_qwenperf.plugin.hooks`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.core.canary import Canary, CanaryJudgement, judge_canary
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.verdict import Judgement
from pytest_qwenperf.gate.baseline import BaselineError
from pytest_qwenperf.gate.canary import canary_path, find_canary
from pytest_qwenperf.gate.diagnosis import Diagnosis
from pytest_qwenperf.gate.judge import losses
from pytest_qwenperf.history.declines import judged_by_history
from pytest_qwenperf.history.reference import References
from pytest_qwenperf.measure.canary import canary_of
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.profile import ProfilerLeftOn, ProfileSetting
from pytest_qwenperf.measure.progress import BootMeter
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.scaling import endpoint_routes
from pytest_qwenperf.measure.sequential import measure_pair, measure_point
from pytest_qwenperf.plugin.progress import boot_progress, point_progress
from pytest_qwenperf.plugin.settings import (
    POOLS_KEY,
    REPORT_KEY,
    SETTINGS_KEY,
    SUITES_KEY,
    TURNS_KEY,
    USES_KEY,
    QwenperfSettings,
    profiles_path,
    repeat_plan,
)
from pytest_qwenperf.serving.endpoints import set_urls
from pytest_qwenperf.serving.hardware import detect
from pytest_qwenperf.serving.placement import Placement, gpu_ids, placement
from pytest_qwenperf.serving.pool import PoolSettings, ServerPool
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload


@pytest.fixture(scope="session")
def qwenperf_settings(pytestconfig: pytest.Config) -> QwenperfSettings:
    return pytestconfig.stash[SETTINGS_KEY]


def _pool(config: pytest.Config, log_dir: Path, launcher: tuple[str, ...], boots: BootMeter | None) -> ServerPool:
    """``boots``: the terminal's lines of each server's boot (None: no progress shown)."""
    settings = config.stash[SETTINGS_KEY]
    return ServerPool(
        PoolSettings(
            log_dir=log_dir,
            launcher=launcher,
            boot_timeout_s=settings.boot_timeout_s,
            endpoints=settings.endpoints or set_urls(settings.endpoint_sets),
            endpoint_model=settings.endpoint_sets.model if settings.endpoint_sets else None,
            api_key=settings.api_key,
            profile=settings.profile,
            boot_progress=boots,
            vllm_cache=settings.vllm_cache,
            turns=config.stash.get(TURNS_KEY, None),
        )
    )


def _log_dir(settings: QwenperfSettings, tmp_path_factory: pytest.TempPathFactory, sub: str = "") -> Path:
    folder = (settings.log_dir or tmp_path_factory.getbasetemp() / "vllm-logs") / sub
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def qwenperf_pool(
    pytestconfig: pytest.Config, qwenperf_settings: QwenperfSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool]:
    """All servers of the session; each config boots once and everything stops at the end."""
    boots = boot_progress(pytestconfig, qwenperf_settings.progress)
    pool = _pool(pytestconfig, _log_dir(qwenperf_settings, tmp_path_factory), qwenperf_settings.launcher, boots)
    pytestconfig.stash[POOLS_KEY]["launcher"] = pool
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def qwenperf_candidate_pool(
    pytestconfig: pytest.Config, qwenperf_settings: QwenperfSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool | None]:
    """The candidate's servers (``--qwenperf-candidate``), logs in a ``candidate`` folder; None without one."""
    if qwenperf_settings.candidate is None:
        yield None
        return
    boots = boot_progress(pytestconfig, qwenperf_settings.progress, "candidate")
    pool = _pool(pytestconfig, _log_dir(qwenperf_settings, tmp_path_factory, "candidate"), qwenperf_settings.candidate, boots)
    pytestconfig.stash[POOLS_KEY]["candidate"] = pool
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


def _placement(cfg: ServingConfig, settings: QwenperfSettings) -> Placement:
    return placement(cfg, detect(), server_cpus=settings.server_cpus, client_cpus=settings.client_cpus)


@pytest.fixture
def vllm_server(
    request: pytest.FixtureRequest,
    serving_config: ServingConfig,
    qwenperf_pool: ServerPool,
    qwenperf_candidate_pool: ServerPool | None,
    qwenperf_settings: QwenperfSettings,
) -> Iterator[Server]:
    """The running server for ``serving_config`` (the launcher's; with a candidate, the candidate's
    boots beside it); stopped after the last test that needs it."""
    cpus = _placement(serving_config, qwenperf_settings).server_cpus
    pools = [pool for pool in (qwenperf_pool, qwenperf_candidate_pool) if pool is not None]
    try:
        yield qwenperf_pool.get(serving_config, cpus, gpu_ids(serving_config, detect()))
    finally:
        uses = request.config.stash.get(USES_KEY, Counter())
        uses[serving_config.key] -= 1
        if uses[serving_config.key] <= 0:
            for pool in pools:
                pool.release(serving_config.key)


MeasureFn = Callable[[ServingConfig, SuiteWorkload], Run]


@pytest.fixture
def qwenperf_measure(
    pytestconfig: pytest.Config,
    qwenperf_pool: ServerPool,
    qwenperf_candidate_pool: ServerPool | None,
    qwenperf_settings: QwenperfSettings,
) -> MeasureFn:
    """``measure(config, workload)``: the session's run of that pair, measured on first use.

    It is judged against its baseline as it is measured, and takes extra repeats while the
    verdicts cannot decide (:func:`~pytest_qwenperf.measure.sequential.measure_point`, up to
    the suite's plan: :func:`~pytest_qwenperf.plugin.settings.repeat_plan`); with a history
    store, its series there, the run included, is judged for a slide, and the run keeps how far
    this runner's sessions differ (:mod:`~pytest_qwenperf.history.declines`). The session's report
    keeps the run with those verdicts and declines. With a candidate, the point is measured on the
    launcher's server and the candidate's, repeats interleaved, and the candidate's run is
    judged against the launcher's (:func:`~pytest_qwenperf.measure.sequential.measure_interleaved`).
    Tests comparing two rungs use it for the rung they are not parametrized with; the test
    ordering usually means that run already exists.
    """
    report = pytestconfig.stash[REPORT_KEY]
    settings = qwenperf_settings

    def _measure(cfg: ServingConfig, workload: SuiteWorkload) -> Run:
        result = report.get(cfg.key, workload.id)
        if result is not None:
            return result
        placed = _placement(cfg, settings)
        gpus = gpu_ids(cfg, detect())
        server = qwenperf_pool.get(cfg, placed.server_cpus, gpus)
        suite = _suite_of(pytestconfig, cfg)
        sets = settings.endpoint_sets
        method = Method.of(
            suite,
            repeat_plan(settings, suite),
            ClientSetup(cpus=placed.client_cpus, workers=settings.client_workers, ray=settings.ray),
            api_key=settings.api_key,
            routes=endpoint_routes(sets) if sets else None,
            profile=_profile_setting(settings, qwenperf_pool),
        )
        progress = point_progress(pytestconfig, settings.progress, f"{cfg.key} / {workload.id}")
        if qwenperf_candidate_pool is not None and report.reference is not None:
            candidate = qwenperf_candidate_pool.get(cfg, placed.server_cpus, gpus)
            # Both servers stay up for the config's other tests; vllm_server stops them after the last.
            servers = (lambda: nullcontext(server), lambda: nullcontext(candidate))
            turns = pytestconfig.stash.get(TURNS_KEY, None)
            pair = measure_pair(*servers, cfg, workload, method, side_by_side=True, progress=progress, turns=turns)
            report.reference.add(pair.reference)
            return report.add(pair.run, pair.judgements, diagnosis=_told(pytestconfig, pair.run, pair.judgements, pair.diagnosis))
        decided = measure_point(server, cfg, workload, method, _references(settings, suite).of, progress)
        run, unreadable = decided.run, decided.unreadable
        if settings.history is not None and unreadable is None:
            try:
                run = judged_by_history(settings.history.where, run, valid=not losses(run), window=suite.history_window)
            except BaselineError as exc:
                unreadable = str(exc)
        diagnosis = _told(pytestconfig, run, decided.judgements, decided.diagnosis)
        return report.add(run, decided.judgements, unreadable=unreadable, diagnosis=diagnosis)

    def measured(cfg: ServingConfig, workload: SuiteWorkload) -> Run:
        """A server whose profiler could not be turned off measures nothing more: it stops (the next test boots it)."""
        try:
            return _measure(cfg, workload)
        except ProfilerLeftOn:
            for pool in (qwenperf_pool, qwenperf_candidate_pool):
                if pool is not None:
                    pool.release(cfg.key)
            raise

    return measured


def _told(config: pytest.Config, run: Run, judgements: tuple[Judgement, ...], diagnosis: Diagnosis | None) -> Diagnosis | None:
    """Tell the hooks of a point's run and verdicts; ``diagnosis`` with the causes they add after its own."""
    config.hook.pytest_qwenperf_run_measured(config=config, run=run)
    config.hook.pytest_qwenperf_point_judged(config=config, run=run, judgements=judgements)
    if diagnosis is None:
        return None
    added = [cause for causes in config.hook.pytest_qwenperf_causes(config=config, run=run, judgements=judgements) for cause in causes or ()]
    return msgspec.structs.replace(diagnosis, causes=(*diagnosis.causes, *added)) if added else diagnosis


def _profile_setting(settings: QwenperfSettings, pool: ServerPool) -> ProfileSetting | None:
    """Where the points' operator profiles go with ``--qwenperf-profile``: beside the session JSON (their
    paths recorded relative to its folder), else beside the servers' logs; None without the option."""
    if not settings.profile:
        return None
    folder = profiles_path(settings)
    if folder is None:
        return ProfileSetting(pool.settings.log_dir / "profiles")
    return ProfileSetting(folder, relative_to=folder.parent)


def _references(settings: QwenperfSettings, suite: Suite) -> References:
    """Where the session's runs find their references: its baselines folder and history store."""
    return References(settings.baselines, settings.history.where if settings.history else None, suite.history_window)


CanaryFn = Callable[[ServingConfig], Canary]


@pytest.fixture
def qwenperf_canary(
    pytestconfig: pytest.Config,
    qwenperf_pool: ServerPool,
    qwenperf_candidate_pool: ServerPool | None,
    qwenperf_settings: QwenperfSettings,
) -> CanaryFn:
    """``canary(config)``: what ``config``'s server answered to the correctness canary, asked once
    per session (booting the server if needed) and kept in the session's report and JSON.
    With a candidate, it is the candidate's answer, and the launcher's is asked too and kept in
    the reference's report. The canary's requests are their own, never inside a measurement."""
    report = pytestconfig.stash[REPORT_KEY]
    settings = qwenperf_settings

    def ask(pool: ServerPool, into: SessionReport, cfg: ServingConfig) -> Canary:
        found = into.canaries.get(cfg.key)
        if found is None:
            server = pool.get(cfg, _placement(cfg, settings).server_cpus, gpu_ids(cfg, detect()))
            floor = _suite_of(pytestconfig, cfg).canary_floor
            found = canary_of(server, cfg, suite=cfg.suite, floor=floor, api_key=settings.api_key)
            into.add_canary(cfg.key, found)
        return found

    def _canary(cfg: ServingConfig) -> Canary:
        if qwenperf_candidate_pool is not None and report.reference is not None:
            ask(qwenperf_pool, report.reference, cfg)
            return ask(qwenperf_candidate_pool, report, cfg)
        return ask(qwenperf_pool, report, cfg)

    return _canary


@pytest.fixture
def qwenperf_canary_judgement(
    pytestconfig: pytest.Config, serving_config: ServingConfig, qwenperf_canary: CanaryFn, qwenperf_settings: QwenperfSettings
) -> CanaryJudgement:
    """``serving_config``'s canary answer against its stored one (beside its baselines), or, when a
    candidate is measured, the candidate's answer against the launcher's, within the suite's
    ``[canary]`` floor (:func:`~pytest_qwenperf.core.canary.judge_canary`).

    A stored answer that cannot be read fails the test with the one line that names the file,
    the field and what was expected."""
    report = pytestconfig.stash[REPORT_KEY]
    judged = _canary_judgement(pytestconfig, serving_config, qwenperf_canary(serving_config), qwenperf_settings)
    report.add_canary_judgement(judged)
    return judged


def _canary_judgement(pytestconfig: pytest.Config, serving_config: ServingConfig, answer: Canary, settings: QwenperfSettings) -> CanaryJudgement:
    report = pytestconfig.stash[REPORT_KEY]
    floor = _suite_of(pytestconfig, serving_config).canary_floor
    if report.reference is not None:
        return judge_canary(report.reference.canaries[serving_config.key], answer, floor)
    unreadable = None
    try:
        stored = find_canary(settings.baselines, answer)
    except BaselineError as exc:
        stored, unreadable = None, str(exc)
    if unreadable is not None:  # failed outside the except, so no chained traceback hides the one line
        pytest.fail(f"qwenperf: {unreadable}", pytrace=False)
    absent = f"no stored canary answer for this hardware, model and config ({canary_path(settings.baselines, answer)})"
    return judge_canary(stored.answer if stored else None, answer, floor, absent=absent)


@pytest.fixture
def qwenperf_run(
    serving_config: ServingConfig,
    suite_workload: SuiteWorkload,
    vllm_server: Server,
    qwenperf_measure: MeasureFn,
    qwenperf_settings: QwenperfSettings,
) -> Run:
    """The measured run of ``suite_workload`` on ``serving_config``: once per session, shared by tests.

    With ``--qwenperf-allow-invalid``, an invalid run skips every test that asks for it, with the
    reasons: its numbers are no verdict either way. By default the tests run and the ones that
    check validity fail."""
    run = qwenperf_measure(serving_config, suite_workload)
    found = losses(run)
    if found and qwenperf_settings.allow_invalid:
        pytest.skip("invalid, not a verdict on vLLM (--qwenperf-allow-invalid): " + "; ".join(f"{loss.reason}: {loss.detail}" for loss in found))
    return run


@pytest.fixture
def qwenperf_suite(pytestconfig: pytest.Config, serving_config: ServingConfig) -> Suite:
    """The suite that defines ``serving_config``."""
    return _suite_of(pytestconfig, serving_config)


def _suite_of(config: pytest.Config, cfg: ServingConfig) -> Suite:
    suites = config.stash[SUITES_KEY]
    found = next((s for s in suites if s.name == cfg.suite), None)
    if found is None:
        raise pytest.UsageError(f"config {cfg.key} belongs to no loaded suite; suites are {[s.name for s in suites]}")
    return found


@pytest.fixture
def qwenperf_judgements(pytestconfig: pytest.Config, qwenperf_run: Run) -> tuple[Judgement, ...]:
    """Every gated metric of the run against its stored baseline (see :func:`~pytest_qwenperf.gate.judge.judge_run`),
    or against the launcher's run when a candidate is measured, as decided when the run was
    measured: at the confidence of its last look (see :func:`qwenperf_measure`).

    A baseline file that cannot be read fails the test with the one line that names the
    file, the field and what was expected (no traceback: the fault is in the file)."""
    report = pytestconfig.stash[REPORT_KEY]
    unreadable = report.unreadable(qwenperf_run)
    if unreadable is not None:
        pytest.fail(f"qwenperf: {unreadable}", pytrace=False)
    return report.judgements(qwenperf_run)


@pytest.fixture
def qwenperf_diagnosis(pytestconfig: pytest.Config, qwenperf_run: Run) -> Diagnosis | None:
    """Why the run regressed against its reference (:func:`~pytest_qwenperf.gate.diagnosis.diagnose`:
    the setup differences, the telemetry that moved beyond its noise, the latency shape), as decided
    when it was measured; None when nothing regressed or there was no reference."""
    return pytestconfig.stash[REPORT_KEY].diagnosis(qwenperf_run)
